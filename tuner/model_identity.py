"""Which model a study was tuned on: a digest of a config.json's architecture (a catalog model is named by its
key), and the checks that the model a study or a recipe is read back with is still that one."""
from __future__ import annotations

import json
from dataclasses import asdict

from cost_model.nouns.errors import AttuneError
from cost_model.nouns.model_spec import LAUNCH_ONLY_FIELDS, ModelSpec, at_later_default

# Where a recipe records its model's architecture digest (recipes/recipe.py writes it under result.active_params,
# an extension of the format like workload.routing; the leaderboard's recipes have none).
RECIPE_FIELD = "architecture"


def architecture_digest(model: ModelSpec) -> str | None:
    """A short digest of a model read from a config.json (None for a catalog model, named by its key)."""
    from cost_model.nouns.model_spec import catalog_names, load_model

    if model.name in catalog_names() and load_model(model.name) == model:
        return None
    return full_digest(model)


def full_digest(model: ModelSpec) -> str:
    """The digest of every architecture field (a catalog model's too: a recipe records it for either kind)."""
    import hashlib

    fields = {k: v for k, v in asdict(model).items()
              if k != "sources" and k not in LAUNCH_ONLY_FIELDS and not at_later_default(k, v)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ModelIdentityError(AttuneError):
    """The model a study's name loads is not the one it was tuned on."""


def _described(digest: str | None) -> str:
    return f"architecture {digest}" if digest else "the catalog's architecture"


def check_model_identity(identity: dict, model: ModelSpec, study: str | None = None,
                         source: str | None = None) -> None:
    """The model a study is read back with (`source`: where it came from, a path or the catalog) is the model it
    was tuned on (the digest it recorded; none for a catalog model): a config.json edited after tuning, or
    another model under the name, is refused."""
    recorded, now = identity.get("architecture"), architecture_digest(model)
    # two catalog models record no digest: their keys tell them apart
    other_catalog = recorded is None is now and identity.get("model") not in (None, model.name)
    who = f"study '{study}'" if study else "the study"
    if other_catalog:
        raise ModelIdentityError(f"{who} was tuned on {identity.get('model')}; the model asked now "
                                 f"({source or model.name}) is the catalog's {model.name}: its figures would be "
                                 f"another model's")
    if recorded != now:
        raise ModelIdentityError(
            f"{who} was tuned on {identity.get('model')} with {_described(recorded)}; the model loaded now "
            f"({source or model.name}) has {_described(now)} (a config.json changed, or another model has its "
            f"name): its figures would be another model's" + ("" if source and source.startswith("--model") else
                                                              "; pass the model it was tuned on with --model PATH"))


def recorded_before_digests(existing: dict, identity: dict) -> bool:
    """A study recorded before config.json digests (no `architecture`), resumed now with one: the same study when
    all else matches, unless it names a catalog model: then it was tuned on the catalog's and the model asked
    now is another one of that name (a config.json folder named like the catalog key)."""
    from cost_model.nouns.model_spec import catalog_names

    if "architecture" not in identity or "architecture" in existing or identity.get("model") in catalog_names():
        return False
    return {k: v for k, v in identity.items() if k != "architecture"} == existing


def as_recorded_name(model: ModelSpec, name) -> ModelSpec:
    """A config.json is named by its file or folder: the same file under another name (a Hugging Face folder
    `Llama-3.1-70B/config.json` for a study or recipe made from `llama31-70b.json`) is the same model, so it takes the
    recorded name before its digest is compared. A model named otherwise (a catalog model, an `_attune` display
    name) keeps its own."""
    from dataclasses import replace

    if isinstance(name, str) and name and model.display_name == model.name and name != model.name:
        return replace(model, name=name, display_name=name)
    return model


def check_recipe_model(recipe: dict, model: ModelSpec, path) -> str | None:
    """The model a recipe is priced with (`model`: the catalog's of its name, or the config.json given with it) is the
    one it was exported from.
    A recipe that records another architecture digest is refused (ModelIdentityError); one that records none
    (the leaderboard's, or exported before tune recorded it) is priced unchecked: the line saying so is returned."""
    result = recipe.get("result")
    block = result.get("active_params") if isinstance(result, dict) else None
    recorded = block.get(RECIPE_FIELD) if isinstance(block, dict) else None
    if recorded is None:
        return (f"{path}: records no model architecture (a leaderboard recipe, or one exported before tune "
                f"recorded it): priced as {model.display_name}, not checked against it")
    now = full_digest(model)
    if str(recorded) != now:
        raise ModelIdentityError(
            f"{path}: field 'result.active_params.{RECIPE_FIELD}' says it was exported from a model of architecture "
            f"{str(recorded)[:40]}, but the model it would be priced as, {model.display_name} (for its model "
            f"'{str(recipe.get('model'))[:60]}'), is architecture {now} (a config.json named like it, or the catalog "
            f"changed since): its figures are another model's; pass the config.json it was exported from with "
            f"--model PATH")
    return None
