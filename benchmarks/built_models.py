"""The model a runner build names: a folder of benchmarks/models (a config.json model's builds carry the folder's
name), else a catalog model."""
from __future__ import annotations

from pathlib import Path

from cost_model.nouns.model_spec import load_model

MODELS = Path(__file__).resolve().parent / "models"


def load_built_model(name: str):
    """benchmarks/models/<name>/config.json where there is one, else the catalog's `name` (ModelError if neither)."""
    config = MODELS / name / "config.json"
    return load_model(str(config) if config.exists() else name)
