"""Presets: built-in definitions and directories on disk."""
