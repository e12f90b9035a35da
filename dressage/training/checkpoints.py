"""What a checkpoint folder holds, and whether teachers and student can share one model.

MOPD restores every teacher into the student's own parameters (slime's TensorBackuper), and a
teacher scores the student's token ids, so every teacher must match the student tensor for tensor
and id for id. This module reads only metadata, never weights:

* Hugging Face layout: ``config.json`` (``text_config`` when nested), safetensors headers.
* Megatron torch_dist layout: ``latest_checkpointed_iteration.txt`` → ``iter_XXXXXXX/`` with
  ``.metadata`` (global tensor shapes, read with megatron-core's dist_checkpointing) and
  ``common.pt`` (the training args).
* Tokenizer: ``tokenizer.json`` or ``vocab.json`` + ``merges.txt``, in the folder itself, in an
  explicit tokenizer folder, or in the folder the torch_dist args name (``hf_checkpoint``).

Check the checkpoints of a MOPD config::

    python -m dressage.training.checkpoints configs/mopd/embedded.json
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from dressage.commands import command_parser
from dressage.config.mopd import MopdConfig, Problem, load_mopd_config
from dressage.tiny.checkpoints import resolve_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "TokenizerFingerprint",
    "check_checkpoints_compatible",
    "inspect_checkpoint",
    "mopd_topk_problems",
    "same_model_problems",
    "tokenizer_fingerprint",
    "validate_mopd_checkpoints",
    "vocab_size",
]

TRACKER = "latest_checkpointed_iteration.txt"
# HF config fields that fix parameter shapes or their meaning; compared when both sides have them.
_HF_ARCH = (
    "model_type",
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "num_experts",
    "moe_intermediate_size",
)
# Reported once, by the summary (hidden size, depth) and vocabulary-rows checks.
_SUMMARISED = {"hidden_size", "num_hidden_layers", "vocab_size"}
# Megatron args that fix shapes beyond what the tensor metadata already shows.
_MEGATRON_ARCH = (
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "ffn_hidden_size",
    "num_experts",
    "untie_embeddings_and_output_weights",
)


class CheckpointError(RuntimeError):
    """A folder that is missing or is not a checkpoint this module can read."""


@dataclass(frozen=True)
class TokenizerFingerprint:
    size: int
    """Distinct token ids: base vocabulary plus added tokens."""
    digest: str
    """sha256 over (id, token) pairs, merges and added tokens: equal digests, equal ids."""
    source: Path


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    layout: Literal["hf", "torch_dist"]
    iteration: int | None = None
    vocab_rows: int | None = None
    """Rows of the input embedding (Megatron pads the vocabulary, so this may exceed size)."""
    hidden_size: int | None = None
    num_layers: int | None = None
    architecture: Mapping[str, Any] = field(default_factory=dict)
    tensor_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    tokenizer: TokenizerFingerprint | None = None
    notes: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# Tokenizers


def tokenizer_fingerprint(folder: Path) -> TokenizerFingerprint | None:
    """Fingerprint of the tokenizer files in ``folder``; None when it has none."""
    tok_json = folder / "tokenizer.json"
    if tok_json.is_file():
        found = _fingerprint_tokenizer_json(_file_sha(tok_json), str(tok_json))
        return replace(found, source=folder)
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    if vocab.is_file():
        token_ids: dict[str, int] = json.loads(vocab.read_text())
        merge_lines = merges.read_text().splitlines() if merges.is_file() else []
        merge_lines = [m for m in merge_lines if m and not m.startswith("#version")]
        added = _added_from_config(folder)
        return _fingerprint(token_ids, merge_lines, added, folder)
    return None


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_BY_CONTENT: dict[str, TokenizerFingerprint] = {}


def _fingerprint_tokenizer_json(content_sha: str, path: str) -> TokenizerFingerprint:
    # Keyed by content: the same tokenizer copied into many checkpoint folders is parsed once.
    if content_sha not in _BY_CONTENT:
        _BY_CONTENT[content_sha] = _parse_tokenizer_json(Path(path))
    return _BY_CONTENT[content_sha]


def _parse_tokenizer_json(path: Path) -> TokenizerFingerprint:
    data = json.loads(path.read_text())
    model = data.get("model") or {}
    merges = [" ".join(m) if isinstance(m, list) else str(m) for m in model.get("merges") or []]
    added = {int(t["id"]): str(t["content"]) for t in data.get("added_tokens") or []}
    return _fingerprint(dict(model.get("vocab") or {}), merges, added, path.parent)


def _added_from_config(folder: Path) -> dict[int, str]:
    added: dict[int, str] = {}
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        for tid, entry in (json.loads(cfg.read_text()).get("added_tokens_decoder") or {}).items():
            added[int(tid)] = str(entry.get("content"))
    extra = folder / "added_tokens.json"
    if extra.is_file():
        added.update({int(i): str(tok) for tok, i in json.loads(extra.read_text()).items()})
    return added


def _fingerprint(
    vocab: Mapping[str, int], merges: Sequence[str], added: Mapping[int, str], source: Path
) -> TokenizerFingerprint:
    digest = hashlib.sha256()
    for token, tid in sorted(vocab.items(), key=lambda kv: kv[1]):
        digest.update(f"{tid}\t{token}\n".encode())
    digest.update(b"\x00merges\n" + "\n".join(merges).encode())
    digest.update(b"\x00added\n")
    for tid, token in sorted(added.items()):
        digest.update(f"{tid}\t{token}\n".encode())
    ids = set(vocab.values()) | set(added)
    return TokenizerFingerprint(size=len(ids), digest=digest.hexdigest(), source=source)


# ---------------------------------------------------------------------------------------------
# Inspection


def inspect_checkpoint(
    path: str | Path, *, ckpt_step: int | None = None, tokenizer: str | Path | None = None
) -> CheckpointInfo:
    """Read a checkpoint folder's metadata; raise :class:`CheckpointError` when unreadable."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root} does not exist or is not a folder")
    if (root / "config.json").is_file():
        info = _inspect_hf(root)
    elif (root / TRACKER).is_file() or (root / ".metadata").is_file() or ckpt_step is not None:
        info = _inspect_torch_dist(root, ckpt_step)
    else:
        raise CheckpointError(
            f"{root} is neither a Hugging Face folder (config.json) nor a Megatron torch_dist "
            f"folder ({TRACKER} and iter_XXXXXXX/)"
        )
    return replace(info, tokenizer=_find_tokenizer(info, tokenizer))


def _find_tokenizer(
    info: CheckpointInfo, explicit: str | Path | None
) -> TokenizerFingerprint | None:
    candidates: list[Path] = []
    if explicit is not None:
        folder = Path(explicit)
        if not folder.is_dir():
            raise CheckpointError(f"tokenizer folder {folder} does not exist")
        candidates.append(folder)
    candidates.append(info.path)
    for key in ("hf_checkpoint", "tokenizer_model"):
        hint = info.architecture.get(f"args.{key}")
        if isinstance(hint, str) and hint:
            candidates.append(Path(hint))
    for folder in candidates:
        if folder.is_dir():
            found = tokenizer_fingerprint(folder)
            if found is not None:
                return found
    return None


def _inspect_hf(root: Path) -> CheckpointInfo:
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{root}/config.json is unreadable: {exc}") from exc
    text = config.get("text_config") if "hidden_size" not in config else None
    flat = {**config, **(text or {})}
    arch = {key: flat[key] for key in _HF_ARCH if key in flat}
    if "architectures" in arch:
        arch["architectures"] = tuple(arch["architectures"] or ())
    shapes = _safetensors_shapes(root)
    rows = next((s[0] for k, s in shapes.items() if k.endswith("embed_tokens.weight")), None)
    return CheckpointInfo(
        path=root,
        layout="hf",
        vocab_rows=rows if rows is not None else flat.get("vocab_size"),
        hidden_size=flat.get("hidden_size"),
        num_layers=flat.get("num_hidden_layers"),
        architecture=arch,
        tensor_shapes=shapes,
    )


def _safetensors_shapes(root: Path) -> dict[str, tuple[int, ...]]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(root.glob("*.safetensors"))]
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        with open(root / name, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for key, entry in header.items():
            if key != "__metadata__":
                shapes[key] = tuple(int(d) for d in entry["shape"])
    return shapes


def _iteration_dir(root: Path, ckpt_step: int | None) -> tuple[Path, int | None]:
    if (root / ".metadata").is_file():
        return root, ckpt_step
    if ckpt_step is not None:
        folder = root / f"iter_{ckpt_step:07d}"
        if not folder.is_dir():
            raise CheckpointError(f"{root} has no {folder.name}/ for ckpt_step {ckpt_step}")
        return folder, ckpt_step
    text = (root / TRACKER).read_text().strip()
    if text == "release":
        return root / "release", None
    if not text.isdigit():
        raise CheckpointError(f"{root}/{TRACKER} holds {text!r}, not an iteration")
    folder = root / f"iter_{int(text):07d}"
    if not folder.is_dir():
        raise CheckpointError(f"{root}/{TRACKER} names {folder.name}/, which does not exist")
    return folder, int(text)


def _inspect_torch_dist(root: Path, ckpt_step: int | None) -> CheckpointInfo:
    folder, iteration = _iteration_dir(root, ckpt_step)
    if not (folder / ".metadata").is_file():
        raise CheckpointError(f"{folder} has no .metadata: not a torch_dist checkpoint")
    try:
        from megatron.core import dist_checkpointing
    except ImportError as exc:
        raise CheckpointError(f"reading {folder} needs megatron-core: {exc}") from exc
    try:
        metadata = dist_checkpointing.load_tensors_metadata(str(folder))
    except Exception as exc:  # any reader failure means we cannot vouch for this checkpoint
        raise CheckpointError(f"{folder}: tensor metadata unreadable: {exc}") from exc
    _check_storage(folder)
    shapes = {
        key: tuple(int(d) for d in tensor.global_shape)
        for key, tensor in metadata.items()
        if not key.startswith("optimizer.")
    }
    notes: list[str] = []
    arch: dict[str, Any] = {}
    try:
        common = dist_checkpointing.load_common_state_dict(str(folder))
        raw = common.get("args")
        args = dict(raw) if isinstance(raw, dict) else (vars(raw) if raw is not None else {})
        arch = {key: args[key] for key in _MEGATRON_ARCH if key in args}
        arch.update(
            {f"args.{k}": args[k] for k in ("hf_checkpoint", "tokenizer_model") if k in args}
        )
    except Exception as exc:  # common.pt only adds hints; the tensor shapes above are the proof
        notes.append(f"common.pt unreadable ({type(exc).__name__}: {exc})")
    embedding = next((s for k, s in shapes.items() if k.endswith("word_embeddings.weight")), None)
    return CheckpointInfo(
        path=root,
        layout="torch_dist",
        iteration=iteration,
        vocab_rows=embedding[0] if embedding else None,
        hidden_size=embedding[1] if embedding else None,
        num_layers=_megatron_layers(shapes),
        architecture=arch,
        tensor_shapes=shapes,
        notes=tuple(notes),
    )


def _check_storage(folder: Path) -> None:
    """Every byte range the checkpoint's ``.metadata`` points at is in its files: a shard file
    that is missing or shorter than its index says (a copy cut short, a save that died) is named
    here, before a load would fail half-way through the teachers.

    Raises:
        CheckpointError: naming the missing or short file.
    """
    from torch.distributed.checkpoint import FileSystemReader

    try:
        storage = FileSystemReader(str(folder)).read_metadata().storage_data or {}
    except Exception as exc:  # the index itself is torn
        raise CheckpointError(f"{folder / '.metadata'} is unreadable: {exc}") from exc
    needed: dict[str, int] = {}
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if name is not None:
            end = int(info.offset) + int(info.length)
            needed[name] = max(needed.get(name, 0), end)
    for name, end in sorted(needed.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: the checkpoint's index names it")
        size = path.stat().st_size
        if size < end:
            raise CheckpointError(
                f"{path} is torn: {size} bytes, the checkpoint's index needs {end}"
            )


def _megatron_layers(shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    layer_keys = [k[len("decoder.layers.") :] for k in shapes if k.startswith("decoder.layers.")]
    numbered = {k.split(".", 1)[0] for k in layer_keys if k.split(".", 1)[0].isdigit()}
    if numbered:
        return len(numbered)
    # megatron-core stacks layers: every decoder.layers.* tensor has a leading layer axis
    leading = {
        shapes["decoder.layers." + k][0] for k in layer_keys if shapes["decoder.layers." + k]
    }
    return leading.pop() if len(leading) == 1 else None


# ---------------------------------------------------------------------------------------------
# Comparison


def check_checkpoints_compatible(
    student: CheckpointInfo,
    teachers: Mapping[str, CheckpointInfo],
    *,
    student_weights: CheckpointInfo | None = None,
) -> list[Problem]:
    """Problems that keep the teachers from sharing the student's model and vocabulary.

    ``student`` is the student's HF folder (tokenizer, config); ``student_weights`` its torch_dist
    folder when the actor loads one. A teacher is compared tensor by tensor with the student
    checkpoint of its own layout, and by tokenizer, hidden size and depth with the student.
    """
    problems: list[Problem] = []
    if student.tokenizer is None:
        problems.append(Problem("student", f"no tokenizer files found for {student.path}"))
    references = [student] + ([student_weights] if student_weights else [])
    for info, subject in [(student_weights, "student ref_load")] + [
        (t, f"teacher {tid!r}") for tid, t in sorted(teachers.items())
    ]:
        if info is None:
            continue
        problems += _tokenizer_problems(subject, info, student)
        problems += _summary_problems(subject, info, student)
        same = next((r for r in reversed(references) if r.layout == info.layout), None)
        if same is not None and same is not info:
            problems += _layout_problems(subject, info, same)
    for info, subject in [(student, "student"), (student_weights, "student ref_load")] + [
        (t, f"teacher {tid!r}") for tid, t in sorted(teachers.items())
    ]:
        tok = (info.tokenizer or student.tokenizer) if info else None
        if info and tok and info.vocab_rows is not None and info.vocab_rows < tok.size:
            problems.append(
                Problem(subject, f"embedding has {info.vocab_rows} rows, tokenizer {tok.size} ids")
            )
    return problems


def same_model_problems(
    subject: str, info: CheckpointInfo, student: CheckpointInfo
) -> list[Problem]:
    """Why ``info`` is not a checkpoint of the student's model ([] when it is): the tokenizer
    (absent on both sides is the same), hidden size and depth, and, in the same layout,
    vocabulary rows, architecture fields and tensor shapes. ``subject`` names ``info`` in each
    problem (e.g. a resumed checkpoint against the run's student)."""
    problems: list[Problem] = []
    if info.tokenizer is not None and student.tokenizer is not None:
        problems += _tokenizer_problems(subject, info, student)
    elif info.tokenizer is not student.tokenizer:  # exactly one side has tokenizer files
        has, lacks = (info, student) if info.tokenizer is not None else (student, info)
        problems.append(Problem(subject, f"tokenizer files in {has.path}, none in {lacks.path}"))
    problems += _summary_problems(subject, info, student)
    if info.layout == student.layout:
        problems += _layout_problems(subject, info, student)
    return problems


def _tokenizer_problems(
    subject: str, info: CheckpointInfo, student: CheckpointInfo
) -> list[Problem]:
    if info.tokenizer is None:
        hint = "; set its tokenizer folder" if info.layout == "torch_dist" else ""
        return [Problem(subject, f"no tokenizer files found for {info.path}{hint}")]
    ref = student.tokenizer
    if ref is not None and info.tokenizer.digest != ref.digest:
        return [
            Problem(
                subject,
                f"tokenizer differs from the student's: {info.tokenizer.size} ids "
                f"({info.tokenizer.source}) vs {ref.size} ids ({ref.source})",
            )
        ]
    return []


def _summary_problems(subject: str, info: CheckpointInfo, ref: CheckpointInfo) -> list[Problem]:
    out = []
    for name in ("hidden_size", "num_layers"):
        mine, theirs = getattr(info, name), getattr(ref, name)
        if mine is not None and theirs is not None and mine != theirs:
            out.append(Problem(subject, f"{name} {mine} != student's {theirs}"))
    return out


def _layout_problems(subject: str, info: CheckpointInfo, ref: CheckpointInfo) -> list[Problem]:
    out = []
    if info.vocab_rows != ref.vocab_rows:
        out.append(
            Problem(subject, f"vocabulary rows {info.vocab_rows} != student's {ref.vocab_rows}")
        )
    for key in sorted(set(info.architecture) & set(ref.architecture) - _SUMMARISED):
        if not key.startswith("args.") and info.architecture[key] != ref.architecture[key]:
            out.append(
                Problem(
                    subject,
                    f"{key} {info.architecture[key]!r} != student's {ref.architecture[key]!r}",
                )
            )
    if info.tensor_shapes and ref.tensor_shapes:
        diff = _shape_diff(info.tensor_shapes, ref.tensor_shapes)
        if diff:
            out.append(Problem(subject, "tensors differ from the student's: " + "; ".join(diff)))
    return out


def _shape_diff(
    mine: Mapping[str, tuple[int, ...]], ref: Mapping[str, tuple[int, ...]], limit: int = 3
) -> list[str]:
    missing = sorted(set(ref) - set(mine))
    extra = sorted(set(mine) - set(ref))
    shaped = sorted(k for k in set(mine) & set(ref) if mine[k] != ref[k])
    out = [f"{k} {mine[k]} vs {ref[k]}" for k in shaped[:limit]]
    out += [f"missing {k}" for k in missing[:limit]] + [f"extra {k}" for k in extra[:limit]]
    hidden = len(missing) + len(extra) + len(shaped) - len(out)
    return out + ([f"... {hidden} more"] if hidden > 0 else [])


def vocab_size(info: CheckpointInfo) -> int | None:
    """The model's vocabulary: ``vocab_size`` of a Hugging Face ``config.json``, else the
    embedding's rows (None when neither is known)."""
    size = info.architecture.get("vocab_size")
    return size if isinstance(size, int) else info.vocab_rows


def mopd_topk_problems(student: CheckpointInfo, k: int) -> list[Problem]:
    """``--mopd-topk`` ``k`` against the student's vocabulary (a teacher shares it): [] when the
    vocabulary has at least ``k`` tokens or is unknown."""
    size = vocab_size(student)
    if size is None or k <= size:
        return []
    return [
        Problem(
            "option --mopd-topk",
            f"--mopd-topk {k} exceeds the student's vocabulary of {size} tokens (vocab_size of "
            f"{student.path}): a position has no more tokens to keep",
        )
    ]


def validate_mopd_checkpoints(
    config: MopdConfig,
    *,
    hf_checkpoint: str | None = None,
    ref_load: str | None = None,
    ckpt_step: int | None = None,
    mopd_topk: int | None = None,
) -> list[Problem]:
    """Inspect and compare the student and every teacher of ``config``; [] when all is well.

    The student comes from the keyword arguments when given, else from ``config.student``.
    ``mopd_topk``: the K of a ``topk`` run, checked against the student's vocabulary.
    """
    student_spec = config.student
    hf = hf_checkpoint or (student_spec.hf_checkpoint if student_spec else None)
    ref = ref_load or (student_spec.ref_load if student_spec else None)
    step = (
        ckpt_step if ckpt_step is not None else (student_spec.ckpt_step if student_spec else None)
    )
    problems: list[Problem] = []
    if not hf:
        return [Problem("student", "no hf_checkpoint given (run config or config.student)")]
    student = _inspect_or_report("student hf_checkpoint", hf, None, None, problems)
    weights = _inspect_or_report("student ref_load", ref, step, hf, problems) if ref else None
    teachers: dict[str, CheckpointInfo] = {}
    for tid, spec in sorted(config.teachers.items()):
        found = _inspect_or_report(
            f"teacher {tid!r}", spec.load, spec.ckpt_step, spec.tokenizer, problems
        )
        if found is not None:
            teachers[tid] = found
    if student is not None:
        problems += check_checkpoints_compatible(student, teachers, student_weights=weights)
        if mopd_topk is not None:
            problems += mopd_topk_problems(student, mopd_topk)
    return problems


_MAX_VOCAB_PADDING = 1024
"""More embedding rows than a model's vocabulary that Megatron's padding can explain."""


def continued_checkpoint_problems(
    hf_checkpoint: str | None, load: str | None, ckpt_step: int | None
) -> list[Problem]:
    """Why the earlier run's Megatron checkpoint at ``load`` (iteration ``ckpt_step``) cannot
    start this run's student ([] when it can): unreadable, torn, or another model (hidden size,
    depth, tokenizer, embedding rows beyond Megatron's padding of the vocabulary) than
    ``hf_checkpoint``."""
    problems: list[Problem] = []
    if not hf_checkpoint:
        return [Problem("continue_from", "no --hf-checkpoint to compare the checkpoint with")]
    if not load:
        return [Problem("continue_from", "no --load: the checkpoint to continue from is not named")]
    student = _inspect_or_report("student hf_checkpoint", hf_checkpoint, None, None, problems)
    info = _inspect_or_report("continue_from", load, ckpt_step, hf_checkpoint, problems)
    if student is None or info is None:
        return problems
    problems += same_model_problems("continue_from", info, student)
    size, rows = vocab_size(student), info.vocab_rows
    if info.layout != student.layout and size is not None and rows is not None:
        # Megatron pads the embedding to a multiple of 128 x TP (at most 1,023 rows at TP 8)
        if not size <= rows < size + _MAX_VOCAB_PADDING:
            problems.append(
                Problem(
                    "continue_from",
                    f"embedding has {rows} rows, the student's vocabulary {size} tokens",
                )
            )
    return problems


def _inspect_or_report(
    subject: str,
    value: str | None,
    step: int | None,
    tokenizer: str | None,
    problems: list[Problem],
) -> CheckpointInfo | None:
    if value is None:
        return None
    try:
        tok_dir = str(resolve_checkpoint(tokenizer)) if tokenizer else None
        return inspect_checkpoint(resolve_checkpoint(value), ckpt_step=step, tokenizer=tok_dir)
    except (CheckpointError, ValueError, OSError) as exc:
        problems.append(Problem(subject, str(exc)))
        return None


def _describe(problems: Iterable[Problem]) -> str:
    return "\n".join(f"  - {p}" for p in problems)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dressage.training.checkpoints [CONFIG]``: exit 1 listing every mismatch."""
    parser = command_parser(
        "python -m dressage.training.checkpoints",
        description="Check that a MOPD config's student and teachers share architecture, "
        "tokenizer and vocabulary. Exit 1 listing every mismatch.",
    )
    parser.add_argument(
        "config", nargs="?", help="the MOPD config JSON (default: $DRESSAGE_MOPD_CONFIG)"
    )
    args = parser.parse_args(argv)
    problems = validate_mopd_checkpoints(load_mopd_config(args.config))
    if problems:
        print(f"checkpoints are incompatible:\n{_describe(problems)}", file=sys.stderr)
        return 1
    print("ok: student and teachers share architecture, tokenizer and vocabulary")
    return 0


if __name__ == "__main__":
    sys.exit(main())
