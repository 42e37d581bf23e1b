"""A study is told apart by its profile's content, not only its name; a profile file follows the umask; a hand-edited
profile's errors name what is wrong (sweep F)."""
import copy
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cost_model.derive_profile import derive_profile
from cost_model.nouns.hardware import gpu_names, load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from cost_model.profile import ProfileError, content_digest, load_profile, parse_profile, shipped_profile
from experiments.checks.hardware_profile import write_profile
from tuner.storages import StudyError
from tuner.study import PROFILE_DIGEST, StudyConfig, load_or_create, open_storage, precheck_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def b200_raw() -> dict:
    return derive_profile(shipped_profile("h200").raw, load_gpu("h200"), load_gpu("b200"))


def written(raw: dict, path: Path) -> Path:
    write_profile(raw, path)
    return path


def config_with(profile) -> StudyConfig:
    return StudyConfig(load_model("qwen3-30b-a3b"), load_gpu("b200"), 8, Workload(), profile=profile)


# ---------------------------------------------------------------- the digest

def test_the_digest_is_of_the_parsed_figures_not_the_text(b200_raw, tmp_path):
    plain = load_profile(written(b200_raw, tmp_path / "a.yaml"))
    other = tmp_path / "b.yaml"   # block style, keys sorted, 2.0 for 2: the same figures
    text = yaml.safe_dump(b200_raw, default_flow_style=False, sort_keys=True, width=80)
    other.write_text("# re-typed by hand\n" + text.replace("count: 2\n", "count:    2.0\n"))
    assert "count:    2.0" in other.read_text()
    assert load_profile(other).digest() == plain.digest() == content_digest(b200_raw)
    noted = copy.deepcopy(b200_raw)
    noted.setdefault("notes", []).append("a note prices nothing")
    assert content_digest(noted) == plain.digest()
    for edit in (lambda d: d["memory"].update(hbm_copy_tb_s=3.0),        # a figure the model reads
                 lambda d: d["memory"].update(h2d_256mib_gb_s=1.0),      # one it does not parse
                 lambda d: d.update(device="B200 (edited)")):
        changed = copy.deepcopy(b200_raw)
        edit(changed)
        assert content_digest(changed) != plain.digest()


def test_a_study_records_its_profiles_digest_and_the_shipped_profile_none(b200_raw, tmp_path):
    profile = load_profile(written(b200_raw, tmp_path / "a.yaml"))
    assert config_with(profile).identity()[PROFILE_DIGEST] == profile.digest()
    assert len(profile.digest()) == 16
    assert PROFILE_DIGEST not in config_with(None).identity()


# ---------------------------------------------------------------- resuming

def test_a_resume_with_other_figures_under_the_same_name_is_refused_in_one_line(b200_raw, tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 's.sqlite3'}")
    first = load_profile(written(b200_raw, tmp_path / "a.yaml"))
    load_or_create(storage, "s", config_with(first))
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(b200_raw, default_flow_style=False, sort_keys=True))
    load_or_create(storage, "s", config_with(load_profile(same)))          # the same figures, written otherwise
    slow = copy.deepcopy(b200_raw)
    slow["memory"]["hbm_copy_tb_s"] = 3.0
    edited = load_profile(written(slow, tmp_path / "slow.yaml"))
    assert config_with(edited).profile_name() == config_with(first).profile_name()
    for check in (precheck_study, load_or_create):
        with pytest.raises(StudyError) as e:
            check(storage, "s", config_with(edited))
        text = str(e.value)
        assert "\n" not in text and "other figures under the same name" in text, text
        assert f"{first.digest()} recorded, {edited.digest()} asked" in text
    recorded = storage.get_study_user_attrs(storage.get_study_id_from_name("s"))["config"]
    assert recorded[PROFILE_DIGEST] == first.digest()   # the refusal changed nothing


def test_a_study_recorded_before_digests_resumes_with_its_profile_and_records_the_digest(b200_raw, tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 's.sqlite3'}")
    profile = load_profile(written(b200_raw, tmp_path / "a.yaml"))
    study = load_or_create(storage, "old", config_with(profile))
    old = {k: v for k, v in config_with(profile).identity().items() if k != PROFILE_DIGEST}
    study.set_user_attr("config", old)        # as a study made before this change recorded it: the name alone
    precheck_study(storage, "old", config_with(profile))
    assert PROFILE_DIGEST not in storage.get_study_user_attrs(study._study_id)["config"]   # a check writes nothing
    other_name = copy.deepcopy(b200_raw)
    other_name["date"] = "2027-01-01"
    with pytest.raises(StudyError, match="profile: .* recorded, .* asked") as e:   # another name: refused as before
        load_or_create(storage, "old", config_with(load_profile(written(other_name, tmp_path / "o.yaml"))))
    assert "same name" not in str(e.value)
    load_or_create(storage, "old", config_with(profile))   # the name it recorded: accepted, and its digest recorded
    assert storage.get_study_user_attrs(study._study_id)["config"] == config_with(profile).identity()
    slow = copy.deepcopy(b200_raw)
    slow["memory"]["hbm_copy_tb_s"] = 3.0
    with pytest.raises(StudyError, match="other figures under the same name"):
        load_or_create(storage, "old", config_with(load_profile(written(slow, tmp_path / "slow.yaml"))))


def test_a_changed_profile_is_another_scored_space(b200_raw, tmp_path):
    from tuner.space_cache import space_key

    class Runner:
        name = "predict"

    a = load_profile(written(b200_raw, tmp_path / "a.yaml"))
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(b200_raw, default_flow_style=False, sort_keys=True))
    unparsed = copy.deepcopy(b200_raw)
    unparsed["memory"]["h2d_256mib_gb_s"] = 1.0   # a figure no parsed field holds: only the digest sees it
    b = load_profile(written(unparsed, tmp_path / "b.yaml"))
    assert repr(a) == repr(b)
    key = space_key(config_with(a), Runner(), None)
    assert space_key(config_with(load_profile(same)), Runner(), None) == key
    assert space_key(config_with(b), Runner(), None) != key
    assert space_key(config_with(None), Runner(), None) != key


# ---------------------------------------------------------------- the file's mode

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_profile_follows_the_umask(b200_raw, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = written(b200_raw, tmp_path / "sub" / "p.yaml")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert load_profile(path).digest() == content_digest(b200_raw)
    assert [p.name for p in path.parent.iterdir()] == ["p.yaml"]   # no temporary file left


def test_tune_profile_derive_writes_a_shareable_file(tmp_path):
    proc = subprocess.run(f"umask 022 && {sys.executable} -m tuner profile --derive b200 --out j.yaml", shell=True,
                          cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT),
                                                                             "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "j.yaml").stat().st_mode) == 0o644
    assert load_profile(tmp_path / "j.yaml").gpu_type == "b200"


# ---------------------------------------------------------------- hand-edited profiles

@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.pop("cpu_adam"), "the cpu_adam section is missing"),
    (lambda d: d.pop("memory"), "the memory section is missing"),
    (lambda d: d.pop("gemm_bf16"), "the gemm_bf16 section is missing"),
    (lambda d: d.update(attention_bf16=None), "the attention_bf16 section is missing"),
    (lambda d: d.update(cpu_adam=[1, 2]), "the cpu_adam section must be a mapping, got list"),
    (lambda d: d.update(grouped_gemm_bf16={"a": 1}), "the grouped_gemm_bf16 section must be a list, got dict"),
    (lambda d: d["memory"].pop("d2h_gb_s"), "the memory section has no d2h_gb_s"),
    (lambda d: d.update(gpu_type=7), "gpu_type must be a GPU type name such as h200, got int 7"),
    (lambda d: d.update(gpu_type=["b200"]), "gpu_type must be a GPU type name such as h200, got list"),
    (lambda d: d.pop("gpu_type"), "gpu_type must be a GPU type name such as h200, got nothing"),
    (lambda d: d.update(provenance=""), "provenance must be measured or derived"),
    (lambda d: d.update(gpu_type="a100"), "gpu_type a100 is not a GPU type tune knows (known: "
     + ", ".join(gpu_names()) + ")"),
])
def test_a_hand_edited_profile_says_what_is_wrong_in_one_line(b200_raw, tmp_path, edit, needle):
    data = copy.deepcopy(b200_raw)
    edit(data)
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    text = str(e.value)
    assert text.startswith(f"{path}: ") and needle in text and "\n" not in text, text
    assert "KeyError" not in text and "malformed" not in text


def test_the_cli_refuses_an_unknown_or_non_string_gpu_type_with_exit_2(b200_raw, tmp_path):
    for value, needle in (("a100", "is not a GPU type tune knows"), (7, "must be a GPU type name")):
        data = dict(b200_raw, gpu_type=value)
        (tmp_path / "e.yaml").write_text(yaml.safe_dump(data))
        proc = subprocess.run([sys.executable, "-m", "tuner", "predict", "--model", "qwen3-30b-a3b", "--gpu", "b200",
                               "--profile", "e.yaml"], cwd=tmp_path, capture_output=True, text=True,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert needle in lines[0] and "--gpu a100" not in lines[0] and "profile of 7" not in lines[0]


def test_every_shipped_profile_still_parses():
    for gpu in gpu_names():
        path = ROOT / f"cost_model/data/profiles/{gpu}.yaml"
        assert parse_profile(path.read_text(), str(path)).gpu_type == gpu
        assert load_profile(path).digest() == shipped_profile(gpu).digest()
