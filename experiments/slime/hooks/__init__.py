"""Hooks that slime loads into its Megatron actors (each module is self-contained: stdlib and torch only)."""
