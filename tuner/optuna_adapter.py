"""Every use of Optuna's internals, in one place: the rest of tuner uses Optuna's public API and these calls.

Optuna has no public way to reach a study's storage or a trial's storage id, to write a trial's attributes in one
transaction, to read which trials have a heartbeat, or to name the tables of its RDB schema; tune needs each (see
the callers). Optuna's version is bounded in pyproject.toml; a new major version is checked here first.
"""
from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The study's storage (its public methods: get_trial, set_trial_state_values, record_heartbeat, ...)."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    return study._study_id


def trial_id_of(trial: optuna.Trial | FrozenTrial) -> int:
    """The storage's id of a running or a frozen trial (not its number)."""
    return trial._trial_id


def stored_trial(study: optuna.Study, trial: optuna.Trial) -> FrozenTrial:
    """The trial as the storage has it now (another tuner may have ended it)."""
    return study._storage.get_trial(trial._trial_id)


def new_running_trial(study: optuna.Study, template: FrozenTrial) -> int:
    """Store `template` (a RUNNING trial with its parameters and attributes) in one storage call; its id."""
    return study._storage.create_new_trial(study._study_id, template_trial=template)


def trial_of(study: optuna.Study, tid: int) -> optuna.Trial:
    """The running trial of storage id `tid`, as ask would hand it out."""
    return optuna.Trial(study, tid)


def set_trial_attrs(trial: optuna.Trial, attrs: dict) -> None:
    """Set `attrs` (JSON-serialisable values) as the running trial's user attributes, in one transaction where
    the storage is Optuna's RDB storage.

    On SQLite each commit waits for the disk (about 15 ms here), and a trial records a dozen attributes (layout,
    prediction, result, the flat figures optuna-dashboard shows): one commit for them all makes a predicted trial
    several times faster and leaves no trial with half of its figures. Optuna has no public call for this: its RDB
    storage's own per-attribute upsert is run inside one session. Any other storage takes them one by one."""
    if not attrs:
        return
    storage = trial.storage
    rdb = getattr(storage, "_backend", storage)   # Optuna wraps an RDBStorage in a cache
    write = getattr(rdb, "_set_trial_attr_without_commit", None)
    cached = getattr(trial, "_cached_frozen_trial", None)
    if not isinstance(rdb, optuna.storages.RDBStorage) or write is None or cached is None:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(rdb.scoped_session, True) as session:
        for key, value in attrs.items():
            write(session, models.TrialUserAttributeModel, trial._trial_id, key, value)
    cached.user_attrs.update(attrs)   # what Trial.set_user_attr keeps for trial.user_attrs


def beating(storage, trial_ids: list[int]) -> set[int]:
    """Those of `trial_ids` that have a heartbeat record (Optuna's RDB table; no public reader)."""
    if not trial_ids:
        return set()
    from optuna.storages._rdb.models import TrialHeartbeatModel
    from optuna.storages._rdb.storage import _create_scoped_session

    rdb = getattr(storage, "_backend", storage)   # Optuna wraps an RDBStorage in a cache
    with _create_scoped_session(rdb.scoped_session) as session:
        rows = session.query(TrialHeartbeatModel.trial_id).filter(TrialHeartbeatModel.trial_id.in_(trial_ids))
        return {r[0] for r in rows.all()}


def discard_thread_session(storage) -> None:
    """Roll back and close this thread's RDB session: Optuna rolls a storage call's transaction back on an Exception,
    not on the KeyboardInterrupt a signal raises (tuner.interrupts), so an interrupted call can leave the thread's
    session mid-transaction, holding the database's locks. Nothing for other storages."""
    rdb = getattr(storage, "_backend", storage)   # Optuna wraps an RDBStorage in a cache
    if isinstance(rdb, optuna.storages.RDBStorage):
        rdb.scoped_session.remove()


def optuna_tables() -> set[str]:
    """The tables of Optuna's RDB schema (and its migration tool's)."""
    from optuna.storages._rdb import models

    return set(models.BaseModel.metadata.tables) | {"alembic_version"}


def first_unreadable(engine) -> tuple[str, int | None, str, str] | None:
    """The first stored attribute or parameter distribution that is not JSON (Optuna reads a study no further
    than it), read from Optuna's tables directly: (owner 'trial' or 'study', the trial's number or None,
    'attribute' or 'parameter', its name); None when every one reads."""
    import json

    import sqlalchemy

    queries = (("trial_user_attributes", "trial"), ("trial_system_attributes", "trial"),
               ("study_user_attributes", "study"), ("study_system_attributes", "study"))

    def number(db, owner: str, owner_id):
        if owner == "study":
            return None
        return db.execute(sqlalchemy.text("SELECT number FROM trials WHERE trial_id = :i"), {"i": owner_id}).scalar()

    with engine.connect() as db:
        for table, owner in queries:
            key = "trial_id" if owner == "trial" else "study_id"
            for owner_id, name, text in db.execute(sqlalchemy.text(f"SELECT {key}, key, value_json FROM {table}")):
                try:
                    json.loads(text)
                except (TypeError, ValueError):
                    return owner, number(db, owner, owner_id), "attribute", name
        for tid, name, text in db.execute(sqlalchemy.text(
                "SELECT trial_id, param_name, distribution_json FROM trial_params")):
            try:
                json.loads(text)
            except (TypeError, ValueError):
                return "trial", number(db, "trial", tid), "parameter", name
    return None
