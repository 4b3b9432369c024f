"""A search of an hf: model: its study is named by the folder and the head, a study made for one
head is not resumed for another, and its export plans the same child again."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.deploy import export
from autotune.host.machine import Machine
from autotune.measure import requests
from autotune.model import envfile
from autotune.search import loop, opening
from autotune.study.storage import StudyError
from tests.support.studies import fake_runner, request


def test_the_study_is_named_by_the_folder_and_the_head(tmp_path: Path, here: Machine, tiny_bert: Path) -> None:
    opened = opening.open_search(request(tmp_path, 1, model=f"hf:{tiny_bert}", task="feature-extraction",
                                         seq_len=16), here)
    assert opened.name == "tiny-bert-feature-extraction-bs1-latency"
    assert opened.study.user_attrs["task"] == "feature-extraction"
    assert opened.study.user_attrs["settings"]["input_shape"] == "16"
    typed = opening.validate(request(tmp_path, 1, model="hf:bert"), here)[0]
    assert opening.study_name(request(tmp_path, 1), typed) == "bert-sequence-classification-bs1-latency"


def test_a_study_made_for_one_head_is_not_resumed_for_another(tmp_path: Path, here: Machine,
                                                              tiny_bert: Path) -> None:
    opening.open_search(request(tmp_path, 1, model=f"hf:{tiny_bert}", study="mine", seq_len=16), here)
    with pytest.raises(StudyError, match=r"was made for task=sequence-classification, not feature-extraction"):
        opening.open_search(request(tmp_path, 1, model=f"hf:{tiny_bert}", study="mine", seq_len=16,
                                    task="feature-extraction"), here)
    with pytest.raises(StudyError, match=r"was measured with input_shape=16, not 32; use another --study "
                                         r"name or the same --seq-len$"):
        opening.open_search(request(tmp_path, 1, model=f"hf:{tiny_bert}", study="mine", seq_len=32), here)


def test_the_export_plans_the_same_child_again(tmp_path: Path, here: Machine, tiny_bert: Path) -> None:
    opened = opening.open_search(request(tmp_path, 3, model=f"hf:{tiny_bert}", task="feature-extraction",
                                         seq_len=16), here)
    loop.run_search(opened, here, lambda e: None, runner=fake_runner)
    best = export.pick_trial(opened.study, None)
    path = tmp_path / "best.env"
    export.write(path, export.render(opened.study, best))
    env = export.read(path).env
    assert (env[envfile.SEQ_LEN_VAR], env[envfile.TASK_VAR]) == ("16", "feature-extraction")
    assert "AUTOTUNE_INPUT_SHAPE" not in env
    again = requests.plan_from_exported(env, here)
    assert (again.bench.model, again.bench.item_shape, again.bench.task) == (f"hf:{tiny_bert}", (16,),
                                                                             "feature-extraction")
    assert again.instances[0].command[-2:] == ("--task", "feature-extraction")
