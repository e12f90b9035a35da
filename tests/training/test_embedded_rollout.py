"""The embedded rollout manager: data source -> agents through the proxy -> rewards -> train_data.

The engine behind the real proxy is an oracle (scripted): it reads the conversation and writes
the ideal tool call, then an answer: the tool's result for calculator prompts, ``0`` for lookup
prompts. So the calculator trajectories earn reward 1 and the lookup ones 0, and the
calculator dataset runs the compacting agent after every turn (two segments per trajectory).
The weight push runs against the real embedded engine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from dressage.config.mopd import MOPD_HOOKS, mopd_args_defaults
from dressage.proxy.testing import EngineReply
from dressage.proxy.tito import TITOTokenizer, create_tito_tokenizer
from dressage.rollout.data_source import MopdDataSource
from dressage.schemas import samples_to_table, train_data_to_table, validate_table
from dressage.training.embedded.data import check_train_data
from dressage.training.embedded.rollout import (
    EmbeddedRolloutManager,
    WeightUpdateError,
    flatten_rollout,
    update_engine_weights,
)
from dressage.types import RolloutFnEvalOutput, Sample
from tests.helpers import ENGINE_KEY, free_port
from tests.proxy.conftest import Script, scripted_proxy

pytestmark = pytest.mark.integration

SLIME_KEYS = [
    "tokens",
    "response_lengths",
    "rewards",
    "raw_reward",
    "truncated",
    "sample_indices",
    "rollout_ids",
    "loss_masks",
    "rollout_mask_sums",
]


class Oracle(Script):
    """Answers like a model that solved the task: a tool call, then the tool's result."""

    def __call__(self, body: dict[str, Any]) -> EngineReply:
        self.bodies.append(body)
        text = self.tito.decode(body["input_ids"])
        turn = text[text.rfind("<|im_start|>user") :]
        result = re.findall(r"<tool_response>\n(.*?)\n</tool_response>|-> (\S+)\n", turn)
        if result:
            value = next(v for pair in result[-1:] for v in pair if v)
            reply = "0" if "lookup" in text.split("<|im_start|>user")[0] else value
            return self.reply(f"{reply}<|im_end|>")
        if '"name": "calculator"' in text:
            expression = re.search(r"Compute (.+?)\. Reply", turn).group(1)  # type: ignore[union-attr]
            call = ("calculator", "expression", expression)
        else:
            key = re.search(r"value of (\w+)\?", turn).group(1)  # type: ignore[union-attr]
            call = ("lookup", "key", key)
        return self.reply(
            f"<tool_call>\n<function={call[0]}>\n<parameter={call[1]}>\n{call[2]}\n"
            "</parameter>\n</function>\n</tool_call><|im_end|>"
        )


@pytest.fixture(scope="module")
def tito(qwen35_tokenizer: Any) -> TITOTokenizer:
    return create_tito_tokenizer(qwen35_tokenizer, "qwen3.5")


@pytest.fixture(scope="module")
def proxy_url(tmp_path_factory: pytest.TempPathFactory, tito: TITOTokenizer) -> Iterator[str]:
    with scripted_proxy(Oracle(tito, "unused"), tmp_path_factory.mktemp("store"), tito) as (
        url,
        _,
    ):
        yield url


def _datasets(root: Path) -> list[dict[str, Any]]:
    from dressage.agents.tasks import make_instances

    calc = make_instances("calculator", 4, seed=1)
    look = make_instances("lookup", 4, seed=1)
    rows = {
        "calc": [
            dict(i.to_row(f"c{k}"), metadata={"agent": "compacting", "compact_after": 1})
            for k, i in enumerate(calc)
        ],
        "look": [i.to_row(f"l{k}") for k, i in enumerate(look)],
    }
    out = []
    for (name, items), task in zip(rows.items(), ("calculator", "lookup"), strict=True):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in items))
        out.append({"name": name, "path": str(path), "teacher_id": name, "task": task})
    return out


def _args(url: str, root: Path, **options: Any) -> SimpleNamespace:
    args = mopd_args_defaults(
        rollout_batch_size=4,
        global_batch_size=4,
        dressage_datasets=_datasets(root),
        dressage_proxy_url=url,
        dressage_agent_attempts=1,
        custom_rm_path=MOPD_HOOKS["custom_rm_path"],
        custom_generate_function_path=MOPD_HOOKS["custom_generate_function_path"],
        rollout_max_response_len=64,
        reward_modules=[],
    )
    for key, value in options.items():
        setattr(args, key, value)
    return args


def test_generate_turns_agent_runs_into_checked_train_data(proxy_url: str, tmp_path: Path) -> None:
    args = _args(proxy_url, tmp_path)
    manager = EmbeddedRolloutManager(args, MopdDataSource(args))
    train_data, samples, metrics = manager.generate(0)

    # 2 calculator trajectories of 2 segments (compacted after each turn) + 2 lookup ones
    assert len(samples) == 6 and list(train_data)[: len(SLIME_KEYS)] == SLIME_KEYS
    by_rollout: dict[int, list[Sample]] = {}
    for s in samples:
        by_rollout.setdefault(s.rollout_id, []).append(s)  # type: ignore[arg-type]
    sizes = sorted(len(v) for v in by_rollout.values())
    assert sizes == [1, 1, 2, 2]
    assert train_data["prompt"] == [s.metadata["teacher_id"] for s in samples]
    rewards = {(s.metadata["dataset"], s.metadata["segment_index"]): s.reward for s in samples}
    assert rewards == {("calc", 0): 0.0, ("calc", 1): 1.0, ("look", 0): 0.0}
    assert metrics["rollout/reward/teacher/calc"] == 1.0
    assert metrics["rollout/reward/teacher/look"] == 0.0
    assert metrics["multi_segment/multi_segment_fraction"] == 0.5
    assert metrics["rollout/trajectories_no_grad"] == 0.0
    assert metrics["rollout/agent/tool_calls_mean"] == 1.0
    assert metrics["rollout/agent/compactions_mean"] == 0.5
    check_train_data(train_data, teachers={"calc", "look"})
    assert validate_table("samples", samples_to_table(samples)).ok
    report = validate_table("train_data", train_data_to_table(train_data))
    assert report.ok, report.to_json()


def test_failed_agents_stay_in_the_batch_as_no_grad(proxy_url: str, tmp_path: Path) -> None:
    args = _args(proxy_url, tmp_path, dressage_agent="tests.rollout.dispatch_agents.broken")
    manager = EmbeddedRolloutManager(args, MopdDataSource(args))
    train_data, samples, metrics = manager.generate(0)
    calc = [s for s in samples if s.metadata["dataset"] == "calc"]
    look = [s for s in samples if s.metadata["dataset"] == "look"]
    assert all("no_grad_reason" in s.metadata for s in look) and len(look) == 2
    assert all("no_grad_reason" not in s.metadata for s in calc)  # its rows name their agent
    assert metrics["rollout/trajectories_no_grad"] == 2.0
    assert metrics["rollout/trajectories_failed"] == 2.0
    assert "rollout/reward/teacher/look" not in metrics
    masks = [m for m, s in zip(train_data["loss_masks"], samples, strict=True) if s in look]
    assert all(not any(m) for m in masks)
    assert validate_table("train_data", train_data_to_table(train_data)).ok


def test_the_rollout_function_is_a_seam_with_slimes_signature(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []

    def rollout_fn(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
        calls.append((args, rollout_id, data_source, evaluation))
        (group,) = data_source.get_samples(1)
        sample = group[0]
        sample.tokens, sample.response_length = [1, 2, 3], 2
        sample.loss_mask, sample.rollout_log_probs, sample.reward = [1, 1], [-0.5, -0.5], 1.0
        return [[sample]]  # a bare list: slime wraps it

    args = _args("http://unused", tmp_path)
    source = MopdDataSource(args)
    manager = EmbeddedRolloutManager(args, source, rollout_fn=rollout_fn)
    train_data, (sample,), metrics = manager.generate(5)
    assert calls == [(args, 5, source, False)]
    assert train_data["tokens"] == [[1, 2, 3]] and train_data["rollout_ids"] == [sample.index]
    assert metrics["rollout/n_samples"] == 1


def test_rollout_function_path_and_slimes_default(tmp_path: Path) -> None:
    args = _args("http://unused", tmp_path)
    args.rollout_function_path = "slime.rollout.sglang_rollout.generate_rollout"
    manager = EmbeddedRolloutManager(args, MopdDataSource(args))
    assert manager.rollout_fn.__module__ == "dressage.rollout.sync_rollout"
    args.rollout_function_path = "tests.rollout.dispatch_agents.nothing"
    with pytest.raises((AttributeError, ImportError), match="nothing"):
        EmbeddedRolloutManager(args, MopdDataSource(args))


def test_eval_reports_anchor_rewards_per_dataset(proxy_url: str, tmp_path: Path) -> None:
    args = _args(proxy_url, tmp_path, rollout_batch_size=2)
    output = EmbeddedRolloutManager(args, MopdDataSource(args)).eval(0)
    assert isinstance(output, RolloutFnEvalOutput)
    assert output.data["calc"]["rewards"] == [1.0] and output.data["look"]["rewards"] == [0.0]


def test_fan_out_siblings_must_share_a_rollout_id() -> None:
    a, b, c = Sample(index=1, rollout_id=1), Sample(index=2, rollout_id=2), Sample(index=3)
    with pytest.raises(ValueError, match="siblings \\[1, 2\\] .*share one rollout_id"):
        flatten_rollout([[[a, b]]])
    with pytest.raises(ValueError, match="siblings \\[1, 3\\] .*share one rollout_id"):
        flatten_rollout([[[a, c]]])  # a sibling without a rollout id
    b.rollout_id = 1
    assert flatten_rollout([[[a, b], c]]) == [a, b, c]  # a group of copies may differ
    with pytest.raises(ValueError, match="holds a str"):
        flatten_rollout([["nope"]])


@pytest.fixture(scope="module")
def engine_url(tiny_model_path: Path) -> Iterator[str]:
    from dressage.engine.testing import serve_engine

    with serve_engine(
        tiny_model_path, device="cpu", num_threads=1, context_length=512, admin_api_key=ENGINE_KEY
    ) as url:
        yield url


def test_weights_go_to_the_engine_with_their_version(
    engine_url: str, tiny_model_path: Path, tmp_path: Path
) -> None:
    from dressage.training.embedded import EmbeddedTrainer, trainer_args

    trainer = EmbeddedTrainer(trainer_args(hf_checkpoint=str(tiny_model_path), device="cpu"))
    for version in (1, 2, 3):
        folder = update_engine_weights(
            trainer, engine_url, version, tmp_path / "w", keep=2, api_key=ENGINE_KEY
        )
        assert folder == tmp_path / "w" / f"weights-v{version}"
        info = httpx.get(f"{engine_url}/model_info").json()
        assert info["weight_version"] == str(version) and info["model_path"] == str(folder)
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["weights-v2", "weights-v3"]

    class Broken:
        def save_weights(self, path: Path) -> Path:
            path.mkdir(parents=True)
            return path

    with pytest.raises(WeightUpdateError, match="weight version 4 from .*weights-v4: HTTP 400"):
        update_engine_weights(Broken(), engine_url, 4, tmp_path / "w", api_key=ENGINE_KEY)
    with pytest.raises(WeightUpdateError, match="HTTP 401: .*DRESSAGE_ENGINE_ADMIN_KEY"):
        update_engine_weights(trainer, engine_url, 4, tmp_path / "w")  # no key
    assert httpx.get(f"{engine_url}/model_info").json()["weight_version"] == "3"
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WeightUpdateError, match=f"engine {dead}: weight version 5 .*ConnectError"):
        update_engine_weights(trainer, dead, 5, tmp_path / "w")
