"""Host copies of a live model's weights, one per tag: slime's TensorBackuper, plus loading.

A :class:`WeightStore` keeps, per tag, one copy of the live model's parameters in host memory:
one flat buffer per tag (pinned when the model is on CUDA) with a view per parameter, so a copy
in either direction is one ``copy_`` per tensor from page-locked memory. ``backup(tag)`` copies
the live parameters out, ``restore(tag)`` copies them back in (queued on the current stream),
``add_teacher`` loads a Hugging Face safetensors checkpoint after checking it fits the live
model tensor for tensor (vocabulary, shapes, names, tied weights), naming the teacher on failure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["WeightStore"]

_ALIGN = 256  # bytes; every tensor view starts aligned for fast DMA


def _host_buffer(nbytes: int, *, pin: bool) -> tuple[Tensor, bool]:
    """A ``uint8`` host buffer of exactly ``nbytes``; returns ``(buffer, registered)``.

    Pinned by registering ordinary memory with CUDA (as torch's own checkpoint stager does):
    the caching pinned allocator behind ``pin_memory=True`` rounds every block up to a power of
    two, which would cost up to 2x host memory per teacher.
    """
    buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    if not pin:
        return buffer, False
    status = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 1))
    if status != 0:
        raise RuntimeError(
            f"pinning {buffer.numel() / 1e9:.2f} GB of host memory failed (cudaError {status}); "
            "check the locked-memory limit (ulimit -l) or pass pin_memory=False"
        )
    return buffer, True


def _safetensors_files(teacher_id: str, path: Path) -> list[Path]:
    if not path.exists():
        raise FileNotFoundError(f"teacher {teacher_id!r}: checkpoint {path} does not exist")
    if path.is_file():
        return [path]
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"teacher {teacher_id!r}: no *.safetensors files in {path}")
    return files


class WeightStore:
    """Per-tag host copies of ``model``'s parameters (tied parameters once).

    Args:
        model: the live model; its parameters are the shared buffers.
        pin_memory: pin the host copies; default: when the model is on CUDA.
    """

    def __init__(self, model: nn.Module, *, pin_memory: bool | None = None) -> None:
        self.model = model
        self.params: dict[str, nn.Parameter] = dict(model.named_parameters())
        self.device = next(iter(self.params.values())).device
        self.pin = self.device.type == "cuda" if pin_memory is None else pin_memory
        self.backups: dict[str, dict[str, Tensor]] = {}
        self._flat: dict[str, Tensor] = {}
        self._registered: dict[str, int] = {}  # tag -> registered host pointer

    @property
    def tags(self) -> list[str]:
        return list(self.backups)

    def nbytes(self, tag: str) -> int:
        return sum(t.numel() * t.element_size() for t in self.backups[tag].values())

    def flat(self, tag: str) -> Tensor:
        """``tag``'s whole host buffer as ``uint8`` (for bandwidth measurements)."""
        return self._flat[tag]

    def drop(self, tag: str) -> None:
        """Forget ``tag`` and free its host buffer."""
        ptr = self._registered.pop(tag, None)
        if ptr is not None:
            self._sync()
            torch.cuda.synchronize(self.device)  # no copy may still read the buffer
            torch.cuda.cudart().cudaHostUnregister(ptr)
        self._flat.pop(tag, None)
        self.backups.pop(tag, None)

    def close(self) -> None:
        """Drop every host copy; the live weights stay."""
        for tag in list(self.backups):
            self.drop(tag)

    def __del__(self) -> None:
        # Registered memory must be unregistered before the allocator frees it.
        if getattr(self, "_registered", None):
            self.close()

    def _slot(self, tag: str) -> dict[str, Tensor]:
        """``tag``'s host tensors: 256-byte-aligned views into one flat buffer."""
        if tag in self.backups:
            return self.backups[tag]
        offsets, total = {}, 0
        for name, p in self.params.items():
            offsets[name] = total
            total += -(-p.numel() * p.element_size() // _ALIGN) * _ALIGN
        flat, registered = _host_buffer(total, pin=self.pin)
        self._flat[tag] = flat
        if registered:
            self._registered[tag] = flat.data_ptr()
        self.backups[tag] = {
            name: flat[offsets[name] : offsets[name] + p.numel() * p.element_size()]
            .view(p.dtype)
            .view(p.shape)
            for name, p in self.params.items()
        }
        return self.backups[tag]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def backup(self, tag: str) -> None:
        """Copy the live parameters into ``tag``'s host slot (allocated on first use)."""
        slot = self._slot(tag)
        with torch.no_grad():
            for name, p in self.params.items():
                slot[name].copy_(p.detach(), non_blocking=True)
        self._sync()

    def restore(self, tag: str) -> None:
        """Copy ``tag``'s host slot into the live parameters (queued on the current stream)."""
        if tag not in self.backups:
            raise KeyError(f"no weights for {tag!r}; known: {sorted(self.backups)}")
        slot = self.backups[tag]
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(slot[name], non_blocking=True)

    def add_state(self, tag: str, state: Mapping[str, Tensor], *, source: str = "state") -> None:
        """Store ``state`` (parameter name -> tensor) under ``tag``, checked like a checkpoint."""
        self._check(tag, {n: tuple(t.shape) for n, t in state.items()}, source)
        slot = self._slot(tag)
        with torch.no_grad():
            for name in self.params:
                slot[name].copy_(state[name])

    def add_teacher(self, teacher_id: str, checkpoint: str | Path) -> None:
        """Load a Hugging Face safetensors checkpoint (folder or file) as ``teacher_id``.

        Fails naming the teacher when the checkpoint is missing, its vocabulary or any tensor
        shape differs from the live model's, a tensor is missing or unexpected, or it unties
        weights the live model ties. Nothing is stored on failure. Tensors are cast to the live
        parameters' dtype.
        """
        from safetensors import safe_open

        path = Path(checkpoint)
        files = _safetensors_files(teacher_id, path)
        where: dict[str, Path] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    where[name] = file
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        self._check(teacher_id, shapes, str(path))
        for alias, canonical in self._tied_aliases().items():
            # The shared buffer holds one matrix: a teacher with a separate one (untied
            # lm_head) would silently be scored with its embeddings instead.
            if alias in where and not torch.equal(
                _read(where[alias], alias), _read(where[canonical], canonical)
            ):
                raise ValueError(
                    f"teacher {teacher_id!r} ({path}): {alias} differs from {canonical}, but the "
                    "student ties them (tie_word_embeddings differs)"
                )
        slot = self._slot(teacher_id)
        for file in files:
            with safe_open(str(file), framework="pt") as f, torch.no_grad():
                for name in self.params:
                    if where[name] == file:
                        slot[name].copy_(f.get_tensor(name))

    def _tied_aliases(self) -> dict[str, str]:
        """Parameter names that alias another parameter (tied weights): alias -> canonical."""
        canonical = {id(p): n for n, p in self.params.items()}
        return {
            n: canonical[id(p)]
            for n, p in self.model.named_parameters(remove_duplicate=False)
            if n not in self.params and id(p) in canonical
        }

    def _check(self, tag: str, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
        """``shapes`` (name -> shape) must hold every live parameter, with its shape."""
        known = set(self.model.state_dict().keys())  # parameters, tied aliases and buffers
        missing = [n for n in self.params if n not in shapes]
        unexpected = sorted(set(shapes) - known)
        embedding = self._embedding_name()
        if embedding in shapes and shapes[embedding] != tuple(self.params[embedding].shape):
            raise ValueError(
                f"teacher {tag!r} ({source}): vocabulary differs: {embedding} has shape "
                f"{shapes[embedding]}, the student's {tuple(self.params[embedding].shape)}"
            )
        if missing or unexpected:
            raise ValueError(
                f"teacher {tag!r} ({source}) does not match the student's architecture: "
                f"missing {missing[:5]} ({len(missing)}), unexpected {unexpected[:5]} "
                f"({len(unexpected)})"
            )
        for name, p in self.params.items():
            if shapes[name] != tuple(p.shape):
                raise ValueError(
                    f"teacher {tag!r} ({source}): tensor {name} has shape {shapes[name]}, "
                    f"the student's {tuple(p.shape)}"
                )

    def _embedding_name(self) -> str:
        get = getattr(self.model, "get_input_embeddings", None)
        weight = getattr(get(), "weight", None) if callable(get) else None
        return next((n for n, p in self.params.items() if p is weight), "")


def _read(file: Path, name: str) -> Tensor:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return f.get_tensor(name)
