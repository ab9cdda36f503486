"""Built-in preset definitions (installed as `bertzoo.builtin_presets`)."""
