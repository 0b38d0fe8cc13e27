"""HF folder I/O: what an HF folder is, lazy safetensors reading, sharded safetensors writing, asset copying.

Reading is lazy (`safe_open` memory-maps each file; `read(name, dim, start, stop)` materialises
only the requested rows or columns), so a TP rank reads only its slice. Writing streams each tensor
to its planned place in its shard, so a converter holds only what it is converting.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.checkpoint.errors import CheckpointReadError, ConversionError, CorruptCheckpointError
from mindrl.models.dtypes import dtype_long_name

if TYPE_CHECKING:
    import torch

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # "5GB", as HF counts it


def parse_size(size: int | str) -> int:
    """'5GB' / '500MB' / '2GiB' / 123 -> bytes (HF's max_shard_size convention: GB = 10^9)."""
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    if text.endswith("B"):
        text = text[:-1]
    return int(text)


class HFCheckpointReader:
    """Tensor names, shapes and (slices of) data of an HF safetensors folder."""

    def __init__(self, hf_dir: str | Path):
        self.dir = Path(hf_dir)
        if not self.dir.is_dir():
            raise ConversionError(f"HF checkpoint folder {self.dir} does not exist")
        self._handles: dict[str, Any] = {}
        self.weight_map = self._weight_map()

    def _weight_map(self) -> dict[str, str]:
        index = self.dir / INDEX_FILE
        if index.is_file():
            try:
                data = json.loads(index.read_text())
                weight_map = dict(data["weight_map"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CorruptCheckpointError(
                    index, f"not a valid safetensors index ({type(exc).__name__}: {exc})"
                ) from exc
            for name, file in weight_map.items():
                if not (self.dir / file).is_file():
                    raise CheckpointReadError(
                        self.dir / file, f"missing ({INDEX_FILE} maps tensor {name} to it)"
                    )
            return weight_map
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            hint = ""
            if any(self.dir.glob("*.bin")):
                hint = " (pytorch_model.bin is not supported: re-save with safe_serialization)"
            raise ConversionError(f"no *.safetensors weights in {self.dir}{hint}")
        weight_map = {}
        for file in files:
            for name in self._open(file.name).keys():
                weight_map[name] = file.name
        return weight_map

    def _open(self, file: str) -> Any:
        from safetensors import safe_open

        handle = self._handles.get(file)
        if handle is None:
            path = self.dir / file
            try:
                handle = safe_open(str(path), framework="pt")
            except Exception as exc:  # SafetensorError / OSError: truncated or not safetensors
                what = safetensors_problem(path) or f"not a readable safetensors file ({exc})"
                raise CorruptCheckpointError(path, what) from exc
            self._handles[file] = handle
        return handle

    def names(self) -> list[str]:
        return list(self.weight_map)

    def _handle_for(self, name: str) -> Any:
        if name not in self.weight_map:
            raise ConversionError(f"tensor {name} is missing from the HF checkpoint {self.dir}")
        return self._open(self.weight_map[name])

    def shape(self, name: str) -> tuple[int, ...]:
        handle = self._handle_for(name)
        try:
            return tuple(handle.get_slice(name).get_shape())
        except Exception as exc:  # the index names a file that does not hold the tensor
            raise CorruptCheckpointError(
                self.dir / self.weight_map[name], f"tensor {name} cannot be read ({exc})"
            ) from exc

    def read(
        self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        handle = self._handle_for(name)
        try:
            if dim is None:
                return handle.get_tensor(name)
            view = handle.get_slice(name)
            if dim == 0:
                return view[start:stop]
            if dim == 1:
                return view[:, start:stop]
        except Exception as exc:
            raise CorruptCheckpointError(
                self.dir / self.weight_map[name], f"tensor {name} cannot be read ({exc})"
            ) from exc
        raise ValueError(f"dim must be None, 0 or 1, not {dim}")

    def dtype_name(self) -> str:
        """The torch dtype name of the checkpoint's floating tensors (float32, bfloat16, ...)."""
        first = next(iter(self.weight_map))
        return dtype_long_name(self.read(first).dtype)

    def close(self) -> None:
        self._handles.clear()


def safetensors_problem(path: str | Path) -> str | None:
    """What is wrong with a safetensors file's framing (too short, a header that does not fit
    or is not JSON, data shorter than the header says), or None if the framing is sound."""
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        return f"truncated: {size} bytes, not even the 8-byte header length"
    with open(path, "rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        if 8 + header_len > size:
            return f"truncated or corrupt: a {header_len}-byte header does not fit in {size} bytes"
        raw = fh.read(header_len)
    try:
        header = json.loads(raw)
        ends = [
            int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"
        ]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        return f"corrupt header ({type(exc).__name__}: {exc})"
    needed = 8 + header_len + max(ends, default=0)
    if size < needed:
        return f"truncated: {size} bytes, but its header needs {needed}"
    return None


SAFETENSORS_DTYPES = {
    "float32": "F32",
    "bfloat16": "BF16",
    "float16": "F16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


class HFShardWriter:
    """Streams tensors straight into model-0000i-of-0000N.safetensors (+ index when N > 1).

    The shapes of every tensor are known before conversion starts (from the architecture), so
    the shards and their safetensors headers are planned up front and each tensor is written to
    its place as it arrives, without buffering a shard and without the bytes copy
    `safetensors.torch.save_file` makes. Tensors must arrive in plan order. The files follow
    the safetensors format: u64 little-endian header length, JSON header (padded with spaces
    to 8 bytes), then the tensors' bytes back to back in header order.
    """

    def __init__(
        self,
        out_dir: str | Path,
        plan: list[tuple[str, tuple[int, ...]]],
        dtype: torch.dtype,
        max_shard_bytes: int | str = DEFAULT_MAX_SHARD_BYTES,
    ):
        import torch

        self.dir = Path(out_dir)
        self.dtype = dtype
        self.max_bytes = parse_size(max_shard_bytes)
        itemsize = torch.empty((), dtype=dtype).element_size()
        dtype_tag = SAFETENSORS_DTYPES[str(dtype).removeprefix("torch.")]
        shards: list[list[tuple[str, tuple[int, ...], int]]] = []
        current = 0
        for name, shape in plan:
            size = itemsize
            for dim in shape:
                size *= dim
            if not shards or (shards[-1] and current + size > self.max_bytes):
                shards.append([])
                current = 0
            shards[-1].append((name, tuple(shape), size))
            current += size
        count = len(shards)
        self.files = [
            SINGLE_FILE if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors"
            for i in range(count)
        ]
        self._order = [
            (name, shape, i) for i, shard in enumerate(shards) for name, shape, _ in shard
        ]
        self._headers = []
        for shard in shards:
            header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
            offset = 0
            for name, shape, size in shard:
                header[name] = {
                    "dtype": dtype_tag,
                    "shape": list(shape),
                    "data_offsets": [offset, offset + size],
                }
                offset += size
            raw = json.dumps(header, separators=(",", ":")).encode()
            raw += b" " * (-(8 + len(raw)) % 8)
            self._headers.append(raw)
        self.total_bytes = sum(size for shard in shards for _, _, size in shard)
        self._next = 0
        self._open: tuple[int, Any] | None = None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self._order):
            raise ConversionError(f"tensor {name} is not in the output plan")
        want, shape, shard = self._order[self._next]
        if name != want or tuple(tensor.shape) != shape:
            raise ConversionError(
                f"output tensor {name} {list(tensor.shape)} arrived where {want} {list(shape)} "
                "was planned"
            )
        import torch

        if self._open is None or self._open[0] != shard:
            self._close()
            fh = open(self.dir / self.files[shard], "wb")
            header = self._headers[shard]
            fh.write(len(header).to_bytes(8, "little"))
            fh.write(header)
            self._open = (shard, fh)
        t = tensor.detach().to(device="cpu", dtype=self.dtype).contiguous()
        if t.numel():
            self._open[1].write(t.reshape(-1).view(torch.uint8).numpy().data)
        self._next += 1

    def _close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def abort(self) -> None:
        self._close()

    def finish(self) -> list[str]:
        """Close the last shard and write the index (when there is more than one shard)."""
        self._close()
        if self._next != len(self._order):
            missing = self._order[self._next][0] if self._order else "anything"
            raise ConversionError(f"output ended before tensor {missing} was written")
        files = list(self.files)
        if len(files) > 1:
            weight_map = {name: self.files[shard] for name, _, shard in self._order}
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.dir / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
            files.append(INDEX_FILE)
        return files


def is_hf_folder(path: str | Path) -> bool:
    """An HF model folder: a config.json beside safetensors weights (decides online HF
    conversion vs a megatron load)."""
    path = Path(path)
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def is_weight_file(path: Path) -> bool:
    return path.name == INDEX_FILE or path.name.endswith(WEIGHT_SUFFIXES)


def copy_hf_assets(src_dir: str | Path, dst_dir: str | Path) -> list[str]:
    """Copy config, generation config, tokenizer and other non-weight files (top level)."""
    src, dst = Path(src_dir), Path(dst_dir)
    copied = []
    for path in sorted(src.iterdir()):
        if path.is_file() and not is_weight_file(path) and not path.name.startswith("."):
            shutil.copy2(path, dst / path.name)
            copied.append(path.name)
    return copied


TOKENIZER_FILES = (
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)


def copy_tokenizer_files(src_dir: str | Path, dst_dir: str | Path) -> list[str]:
    """Copy only tokenizer files (tokenizer*, vocab/merges, special tokens, chat template)."""
    src, dst = Path(src_dir), Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in sorted(src.iterdir()):
        if path.is_file() and (path.name.startswith("tokenizer") or path.name in TOKENIZER_FILES):
            shutil.copy2(path, dst / path.name)
            copied.append(path.name)
    if not copied:
        raise ConversionError(f"--tokenizer-model: no tokenizer files in {src}")
    return copied


def write_hf_config(dst_dir: str | Path, config: dict[str, Any], dtype_name: str) -> None:
    """config.json with its dtype entry set to the dtype of the written tensors."""
    config = dict(config)
    key = "torch_dtype" if "torch_dtype" in config and "dtype" not in config else "dtype"
    config[key] = dtype_name
    Path(dst_dir, "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
