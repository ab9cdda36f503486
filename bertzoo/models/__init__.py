"""Backbones and task models."""
