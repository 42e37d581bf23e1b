"""Which model a study was tuned on: a digest of a config.json's architecture (a catalog model is named by its
key), and the check that the model a study's name loads now is still that one."""
from __future__ import annotations

import json
from dataclasses import asdict

from cost_model.errors import AttuneError
from cost_model.model_spec import ModelSpec


def architecture_digest(model: ModelSpec) -> str | None:
    """A short digest of a model read from a config.json (None for a catalog model, named by its key)."""
    import hashlib

    from cost_model.model_spec import catalog_names, load_model

    if model.name in catalog_names() and load_model(model.name) == model:
        return None
    fields = {k: v for k, v in asdict(model).items() if k != "sources"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ModelIdentityError(AttuneError):
    """The model a study's name loads is not the one it was tuned on."""


def check_model_identity(identity: dict, model: ModelSpec) -> None:
    """The model a study's name loads now is the model it was tuned on (the digest it recorded; none for a
    catalog model): a config.json edited after tuning, or another model under the name, is refused."""
    recorded, now = identity.get("architecture"), architecture_digest(model)
    if recorded != now:
        then = f"architecture {recorded}" if recorded else "the catalog's"
        raise ModelIdentityError(f"study was tuned on {identity.get('model')} with {then} model; the name now loads "
                         f"{'architecture ' + now if now else 'the catalog model'} (a config.json changed, or another "
                         f"model has its name): its figures would be another model's")
