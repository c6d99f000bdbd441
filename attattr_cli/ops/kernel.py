"""Guarded loader and wrappers of the fused CUDA attention / attribution kernels.

The kernels (``attattr_cli/kernels/attattr_attn.cu``, binding ``attattr_ops.cpp``) are built
with ``torch.utils.cpp_extension.load`` on first use and cached under :func:`cache_dir`, with the
toolkit :func:`find_toolkit` finds. Nothing here raises at import time: ask :func:`available`
and :func:`unavailable_reason`, or call :func:`build` at setup time (``build(arch_list="8.0
9.0")`` works without a GPU). The wrappers mirror :mod:`attattr_cli.ops.reference`
(:func:`attribution_from_grad` adds ``causal`` and ``stats``; :func:`attention_forward` returns
``O = softmax(q k^T * scale + mask) v``). Inputs the kernels do not handle (softcap, a general
``[batch, 1, query_pos, key_pos]`` mask, float64, CPU tensors) raise :class:`KernelUnsupported`,
which :mod:`attattr_cli.ops` routes to the reference. kernels/README.md, "What the kernels do"
(supported dtypes, head dims, masks, ``causal``) and "Build" (cache, toolkit).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from attattr_cli.errors import OptionError, first_line

__all__ = ["KernelUnavailable", "KernelUnsupported", "MAX_HEAD_DIM", "SUPPORTED_DTYPES", "attention_forward",
           "attention_forward_with_lse", "attention_forward_with_stats", "attribution_from_grad", "available", "build",
           "Toolkit", "attribution_grid", "cache_dir", "find_toolkit", "key_padding_mask", "normalize_arch_list",
           "lse_from_stats", "source_dir", "sources", "supports", "unavailable_reason", "unsupported_reason"]

log = logging.getLogger(__name__)

EXTENSION_NAME = "attattr_kernels"
OP_NAMESPACE = "attattr"
MAX_HEAD_DIM = 128
MIN_CAPABILITY = (8, 0)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SOURCE_FILES = ("attattr_attn.cu", "attattr_ops.cpp")
CUDA_CFLAGS = ["-O3", "-lineinfo"]  # torch adds -std=c++20 and the -gencode flags
CXX_CFLAGS = ["-O3"]
SILENCE_HINT = "set ATTATTR_KERNEL=torch to silence"
# Device type the ops are registered for; the CPU emulation test in tests/test_kernels.py
# points this and OP_NAMESPACE at a CPU build of the same sources.
_DEVICE_TYPE = "cuda"


class KernelUnavailable(OptionError):
    """The CUDA kernels cannot be used here (no device, CPU build of torch, build failed)."""


class KernelUnsupported(OptionError):
    """The CUDA kernels do not handle these inputs (softcap, general mask, dtype, ...)."""


_lock = threading.RLock()
_state: dict[str, object] = {"tried": False, "loaded": False, "reason": "", "fakes": set()}


# ------------------------------------------------------------------ locations
def source_dir() -> Path:
    """Folder of the kernel sources: ``$ATTATTR_KERNEL_DIR`` or the package's ``kernels/``."""
    override = os.environ.get("ATTATTR_KERNEL_DIR")
    if override:
        return Path(override).expanduser()
    return Path(__file__).resolve().parents[1] / "kernels"


def sources() -> list[Path]:
    """The files compiled into the extension (.cu first)."""
    return [source_dir() / name for name in SOURCE_FILES]


def normalize_arch_list(arch_list: str) -> str:
    """``"8.0 9.0"``, ``"8.0,9.0"`` or ``"8.0;9.0+PTX"`` as torch's ``"8.0;9.0+PTX"``.

    Raises :class:`OptionError` on anything that is not a list of ``X.Y`` (``+PTX``).
    """
    parts = [part for part in re.split(r"[\s,;]+", arch_list.strip()) if part]
    bad = [part for part in parts if not re.fullmatch(r"\d+\.\d+a?(\+PTX)?", part)]
    if not parts or bad:
        raise OptionError(f"not a CUDA architecture list: {arch_list!r}; give compute capabilities such as"
                          ' "8.0 9.0" (sm_80 and sm_90), optionally with +PTX')
    return ";".join(parts)


def _arch_covers(arch_list: str, capability: tuple[int, int]) -> bool:
    """True when a build for ``arch_list`` runs on a device of ``capability``.

    Machine code for X.Y runs on X.Z with Z >= Y; PTX for X.Y on anything >= X.Y.
    """
    for part in arch_list.split(";"):
        ptx = part.endswith("+PTX")
        major, minor = (int(x) for x in part.removesuffix("+PTX").rstrip("a").split("."))
        if (major, minor) <= capability and (ptx or major == capability[0]):
            return True
    return False


def _arch_tag() -> str:
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch_list:
        try:
            arch_list = normalize_arch_list(arch_list)
        except OptionError:  # e.g. torch's named lists ("Ampere"): kept, made file-name safe
            return "archname-" + re.sub(r"[^\w.]+", "_", arch_list.strip())
        return "arch-" + arch_list.replace(";", "_").replace("+", "-")
    if torch.version.cuda is not None and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "arch-default"


def _build_root() -> Path:
    digest = hashlib.sha256()
    for path in sources():
        digest.update(path.name.encode())
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
    digest.update(repr((CUDA_CFLAGS, CXX_CFLAGS)).encode())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cuda = torch.version.cuda or "cpu"
    return base / "attattr" / "kernels" / f"{torch.__version__}-cuda{cuda}-{digest.hexdigest()[:16]}"


def cache_dir() -> Path:
    """Build folder ``~/.cache/attattr/kernels/<torch>-<cuda>-<hash>/<arch>`` (XDG_CACHE_HOME honoured).

    The hash covers the source bytes and the compiler flags; ``<arch>`` is
    ``TORCH_CUDA_ARCH_LIST`` (``arch-8.0_9.0``) or the current device (``sm_90``).
    """
    return _build_root() / _arch_tag()


def _prebuilt_for_device() -> Path | None:
    """A library built earlier for an architecture list that covers the current device."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        return None
    capability = torch.cuda.get_device_capability()
    root = _build_root()
    if not root.is_dir():
        return None
    for folder in sorted(root.glob("arch-*")):
        library = _library_file(folder)
        arch_list = folder.name.removeprefix("arch-").replace("_", ";").replace("-PTX", "+PTX")
        try:
            covers = _arch_covers(arch_list, capability)
        except ValueError:
            continue
        if library.is_file() and covers:
            return library
    return None


# ------------------------------------------------------------------ toolkit
@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit: its root (``CUDA_HOME``), its real nvcc and how it was found."""

    root: Path
    nvcc: Path
    how: str

    def describe(self) -> str:
        return f"CUDA toolkit {self.root} (nvcc {self.nvcc}; {self.how})"


def _script_target(path: Path) -> Path | None:
    """The nvcc a small wrapper script runs (``exec /opt/cuda/bin/nvcc "$@"``), if any."""
    try:
        if path.stat().st_size > 64 * 1024:
            return None
        head = path.read_bytes()[:2]
        if head != b"#!":
            return None
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for token in re.findall(r"[\"']?(/[^\s\"']*/nvcc)\b", text):
        candidate = Path(token)
        if candidate.is_file() and candidate.resolve() != path.resolve():
            return candidate
    return None


def _resolve_nvcc(path: Path) -> Path:
    """``path`` through symbolic links and up to four levels of wrapper scripts."""
    current = path.resolve()
    for _ in range(4):
        target = _script_target(current)
        if target is None:
            return current
        current = target.resolve()
    return current


def find_toolkit() -> Toolkit | None:
    """The CUDA toolkit to build with, or None.  Order: ``CUDA_HOME``, ``CUDA_PATH``, nvcc
    on ``PATH`` (through links and wrapper scripts), ``/usr/local/cuda``."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value:
            root = Path(value).expanduser()
            nvcc = root / "bin" / "nvcc"
            if nvcc.is_file():
                return Toolkit(root, nvcc, f"from ${var}")
    on_path = shutil.which("nvcc")
    if on_path:
        real = _resolve_nvcc(Path(on_path))
        if real.parent.name == "bin" and (real.parent.parent / "include" / "cuda_runtime.h").is_file():
            how = "nvcc on PATH" if real == Path(on_path) else f"nvcc on PATH, {on_path} -> {real}"
            return Toolkit(real.parent.parent, real, how)
    default = Path("/usr/local/cuda")
    if (default / "bin" / "nvcc").is_file():
        return Toolkit(default.resolve(), (default / "bin" / "nvcc").resolve(), "default location")
    return None


def _use_toolkit(toolkit: Toolkit) -> None:
    """Point torch.utils.cpp_extension at ``toolkit`` (it reads CUDA_HOME once, at import)."""
    os.environ["CUDA_HOME"] = str(toolkit.root)
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = str(toolkit.root)


def attribution_grid(batch: int, heads: int, n_q: int, n_k: int, sms: int) -> dict[str, int]:
    """The attribution kernel's launch plan on a GPU with ``sms`` multiprocessors.

    Mirrors ``attattr_attr_plan`` in ``attattr_attn.cu`` (a test compares the two): the
    grid is ``(ceil(n_k / 64), ceil(n_q / 64), batch * groups)``; the heads are split into
    groups only until there are 2 blocks per SM.  Returns ``heads_per_group``, ``groups``,
    ``blocks`` and ``workspace_floats`` (the second pass's scratch, 0 with one group).
    """
    base = -(-n_k // 64) * -(-n_q // 64) * batch
    target = 2 * max(sms, 1)
    groups = min(max(-(-target // base), 1), heads, max(65535 // batch, 1))
    per_group = -(-heads // groups)
    groups = -(-heads // per_group)
    return {"heads_per_group": per_group, "groups": groups, "blocks": base * groups,
            "workspace_floats": batch * groups * n_q * n_k if groups > 1 else 0}


# ------------------------------------------------------------------ loading
def _environment_problem(need_device: bool = True) -> str:
    """Why the kernels cannot be built or run here, with the fix; '' if nothing is wrong."""
    if torch.version.cuda is None:
        return (f"PyTorch {torch.__version__} is a CPU-only build (no CUDA); install a CUDA build of PyTorch to use"
                " the kernels")
    missing = [str(p) for p in sources() if not p.is_file()]
    if missing:
        return (f"kernel sources not found ({', '.join(missing)}); they ship inside the attattr package"
                " (attattr_cli/kernels): reinstall attattr or set ATTATTR_KERNEL_DIR to a folder holding them")
    if not need_device:
        return ""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name()
        return f"GPU {name} is sm_{capability[0]}{capability[1]}; the kernels need sm_80 or newer"
    return ""


def _library_file(build_dir: Path) -> Path:
    return build_dir / f"{EXTENSION_NAME}.so"


def _compile(verbose: bool = False) -> Path:
    """Build (or reuse) the extension and load it into the process; returns the .so path."""
    build_dir = cache_dir()
    library = _library_file(build_dir)
    if not library.is_file() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        library = _prebuilt_for_device() or library
    if library.is_file():
        # Built before (maybe at setup time): load without needing ninja / nvcc.
        torch.ops.load_library(str(library))
        return library
    toolkit = find_toolkit()
    if toolkit is None:
        raise KernelUnavailable("no CUDA toolkit found (nvcc): set CUDA_HOME to the toolkit folder, e.g."
                                " /usr/local/cuda")
    _use_toolkit(toolkit)  # before cpp_extension's import-time guess, and after it
    log.info("attattr: using the %s", toolkit.describe())
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    log.info("attattr: building the CUDA kernels into %s (first use; takes a minute or two)", build_dir)
    cpp_extension.load(name=EXTENSION_NAME, sources=[str(p) for p in sources()], extra_cflags=CXX_CFLAGS,
                       extra_cuda_cflags=CUDA_CFLAGS, build_directory=str(build_dir), is_python_module=False,
                       verbose=verbose)
    return library


def _load(need_device: bool = True, verbose: bool = False, retry: bool = False) -> None:
    with _lock:
        if _state["loaded"] or (_state["tried"] and not retry):
            return
        _state["tried"] = True
        problem = _environment_problem(need_device)
        if problem:
            _state["reason"] = problem
            return
        try:
            _state["library"] = _compile(verbose=verbose)
            _register_fakes(OP_NAMESPACE)
        except Exception as error:  # noqa: BLE001 - any build / load failure is reported, never raised
            where = cache_dir()
            try:
                where.mkdir(parents=True, exist_ok=True)
                (where / "build-error.log").write_text(str(error))
                detail = f" (full log: {where / 'build-error.log'})"
            except OSError:
                detail = ""
            _state["reason"] = f"build or load failed: {first_line(error)}{detail}"
            return
        _state["loaded"] = True
        _state["reason"] = ""


def available() -> bool:
    """True when the kernels are built, loaded and a suitable CUDA device is visible.

    The first call on a CUDA machine builds the extension (cached on disk).  Never raises.
    """
    try:
        _load()
        if not _state["loaded"]:
            return False
        # Built without a device (build() with TORCH_CUDA_ARCH_LIST): still needs one to run.
        problem = _environment_problem(need_device=True)
    except Exception as error:  # noqa: BLE001 - belt and braces: never raise from here
        _state["reason"] = f"loader error: {first_line(error)}"
        return False
    if problem:
        _state["reason"] = problem
        return False
    return True


def unavailable_reason(hint: bool = True) -> str:
    """Why :func:`available` is False, with the fix; '' when the kernels are available.

    With ``hint`` the text ends with "; set ATTATTR_KERNEL=torch to silence".
    """
    if available():
        return ""
    reason = str(_state["reason"]) or "unknown reason"
    return f"{reason}; {SILENCE_HINT}" if hint else reason


def build(verbose: bool = True, arch_list: str | None = None) -> Path:
    """Build the extension now (setup time) and return the path of the built library.

    ``arch_list`` (e.g. ``"8.0 9.0"``) sets ``TORCH_CUDA_ARCH_LIST`` for this process and
    builds for those architectures without a GPU; with neither it nor the variable set
    the architecture is taken from the device.  Needs a CUDA build of PyTorch, a CUDA
    toolkit (:func:`find_toolkit`), ninja and a host C++ compiler.  Raises
    :class:`KernelUnavailable` with the reason on failure.
    """
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch_list:  # for this build only: cpp_extension reads it from the environment
        os.environ["TORCH_CUDA_ARCH_LIST"] = normalize_arch_list(arch_list)
    try:
        need_device = not os.environ.get("TORCH_CUDA_ARCH_LIST")
        _load(need_device=need_device, verbose=verbose, retry=True)
        if not _state["loaded"]:
            raise KernelUnavailable(f"attattr CUDA kernels: {_state['reason']}")
        return _state.get("library") or _library_file(cache_dir())  # type: ignore[return-value]
    finally:
        if arch_list:
            if previous is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = previous


def _require_loaded() -> None:
    if _state["loaded"]:  # fast path, also traceable by torch.compile
        return
    if not available():
        raise KernelUnavailable(f"attattr CUDA kernels unavailable: {unavailable_reason(hint=False)}; use the torch"
                                " backend (ATTATTR_KERNEL=torch)")


# ------------------------------------------------------------- fake (meta) impls
def _register_fakes(namespace: str = OP_NAMESPACE) -> None:
    """Register the ops' fake implementations (shapes only) for torch.compile / meta tensors."""
    done: set = _state["fakes"]  # type: ignore[assignment]
    if namespace in done:
        return

    def attn_forward_fake(q, k, v, mask, scale, causal, stream=-1):
        batch, heads, n_q, d_head = q.shape
        o = q.new_empty((batch, heads, n_q, d_head))
        stats = q.new_empty((batch, heads, n_q, 2), dtype=torch.float32)
        return o, stats

    def attr_from_grad_fake(q, k, v, g, mask, stats, scale, causal, want_maps, stream=-1):
        batch, heads, n_q, _ = q.shape
        n_k = k.shape[2]
        maps_shape = (batch, heads, n_q, n_k) if want_maps else (0,)
        maps = q.new_empty(maps_shape, dtype=torch.float32)
        head_sum = q.new_empty((batch, n_q, n_k), dtype=torch.float32)
        head_max = q.new_empty((batch, heads), dtype=torch.float32)
        return maps, head_sum, head_max

    def attr_key_sums_fake(q, k, v, g, mask, stats, scale, causal, read_from, stream=-1):
        batch, heads = q.shape[:2]
        key_sums = q.new_empty((batch, 2, k.shape[2]), dtype=torch.float32)
        head_max = q.new_empty((batch, heads), dtype=torch.float32)
        return key_sums, head_max

    torch.library.register_fake(f"{namespace}::attn_forward")(attn_forward_fake)
    torch.library.register_fake(f"{namespace}::attr_from_grad")(attr_from_grad_fake)
    torch.library.register_fake(f"{namespace}::attr_key_sums")(attr_key_sums_fake)
    done.add(namespace)


# ------------------------------------------------------------------ wrappers
def key_padding_mask(mask: torch.Tensor | None, batch: int, n_k: int) -> torch.Tensor | None:
    """``mask`` as a ``[batch or 1, n_k]`` key-padding mask, or raise KernelUnsupported.

    Accepts ``[B, n_k]`` and ``[B, 1, 1, n_k]`` (B may be 1).
    """
    if mask is None:
        return None
    shape = tuple(mask.shape)
    if mask.dim() == 4 and shape[1] == 1 and shape[2] == 1:
        mask = mask[:, 0, 0, :]
    if mask.dim() != 2 or mask.shape[0] not in (1, batch) or mask.shape[1] != n_k:
        raise KernelUnsupported(f"the CUDA kernel takes a key-padding mask [batch, key_pos] = [{batch}, {n_k}] (or"
                                f" [batch, 1, 1, key_pos]); got a mask of shape {list(shape)}; a general mask needs"
                                " the torch backend")
    if not mask.is_floating_point():
        raise KernelUnsupported(f"the mask must be an additive float mask, got dtype {mask.dtype}")
    return mask


def unsupported_reason(q: torch.Tensor, mask: torch.Tensor | None = None, softcap: float | None = None,
                       k: torch.Tensor | None = None) -> str:
    """Why the kernel cannot take these inputs ('' if it can).  Does not build anything."""
    if softcap is not None:
        return "logit soft-capping (softcap) is not supported by the CUDA kernel"
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        return "q must be a 4-D tensor [batch, head, query_pos, d_head]"
    if q.device.type != _DEVICE_TYPE:
        return f"the tensors are on {q.device}, not on a CUDA device"
    if q.dtype not in SUPPORTED_DTYPES:
        return f"dtype {q.dtype} is not supported by the CUDA kernel (float32, float16, bfloat16)"
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        return f"head dim {q.shape[-1]} is outside 1..{MAX_HEAD_DIM}"
    if mask is not None:
        n_k = k.shape[2] if k is not None else mask.shape[-1]
        try:
            key_padding_mask(mask, q.shape[0], n_k)
        except KernelUnsupported as error:
            return str(error)
    return ""


def supports(q: torch.Tensor, mask: torch.Tensor | None = None, softcap: float | None = None,
             k: torch.Tensor | None = None) -> bool:
    """True when the kernel handles these inputs (the kernel being available aside)."""
    return not unsupported_reason(q, mask, softcap, k)


def _check(q, k, mask, softcap=None) -> torch.Tensor | None:
    reason = unsupported_reason(q, mask, softcap, k)
    if reason:
        raise KernelUnsupported(f"{reason}; use the torch backend (ATTATTR_KERNEL=torch)")
    _require_loaded()
    return key_padding_mask(mask, q.shape[0], k.shape[2])


def _ops():
    return getattr(torch.ops, OP_NAMESPACE)


def _stream(q: torch.Tensor) -> int:
    """The current CUDA stream as an integer; -1 (resolved by the op) under torch.compile."""
    if torch.compiler.is_compiling():
        return -1
    if q.device.type != "cuda":
        return 0
    return torch.cuda.current_stream(q.device).cuda_stream


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return float(q.shape[-1] ** -0.5 if scale is None else scale)


def attention_forward_with_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, scale: float | None = None, causal: bool = False
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(O, stats)``: O ``[B, H, n_q, d]`` in q's dtype; stats ``[B, H, n_q, 2]`` float32.

    ``stats[..., 0]`` is the row max m of the scaled, masked scores and ``stats[..., 1]``
    the row sum l of ``exp(s - m)`` ((-inf, 0) for a row with no allowed key, whose O
    row is 0).  Pass ``stats`` to :func:`attribution_from_grad` to skip recomputing them.
    """
    kp = _check(q, k, mask)  # before the op is looked up: an unsupported input is refused where no op is loaded
    return _ops().attn_forward(q, k, v, kp, _scale(q, scale), bool(causal), _stream(q))


def lse_from_stats(stats: torch.Tensor) -> torch.Tensor:
    """Row log-sum-exp ``m + log l`` ``[B, H, n_q]`` (+inf for a row with no allowed key)."""
    m, l = stats[..., 0], stats[..., 1]
    return torch.where(l > 0, m + torch.log(l), torch.full_like(m, float("inf")))


def attention_forward_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                               scale: float | None = None, causal: bool = False
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(O, lse)`` with lse the row log-sum-exp ``[B, H, n_q]`` float32."""
    o, stats = attention_forward_with_stats(q, k, v, mask, scale, causal)
    return o, lse_from_stats(stats)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                      scale: float | None = None, causal: bool = False) -> torch.Tensor:
    """``O = softmax(q k^T * scale + mask) v`` ``[B, H, n_q, d]`` in q's dtype (fp32 inside)."""
    return attention_forward_with_stats(q, k, v, mask, scale, causal)[0]


def _common_dtype(q, k, v, g):
    """The inputs as the kernel takes them: one dtype, or bfloat16 q, k, v with a float32 g
    (kept as they are, the split path); other mixes upcast to the widest (g's precision kept)."""
    dtypes = {t.dtype for t in (q, k, v, g)}
    split_g = {q.dtype, k.dtype, v.dtype} == {torch.bfloat16} and g.dtype == torch.float32
    if len(dtypes) > 1 and not split_g:
        work = g.dtype if g.dtype in SUPPORTED_DTYPES else q.dtype
        for t in (q, k, v):
            work = torch.promote_types(work, t.dtype)
        q, k, v, g = (t.to(work) for t in (q, k, v, g))
    return q, k, v, g


def attribution_key_sums(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         mask: torch.Tensor | None = None, scale: float | None = None,
                         softcap: float | None = None, causal: bool = False, read_from: int | None = None,
                         stats: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``reference.attribution_key_sums`` (``key_sum``, ``read_sum``, ``total``, ``head_max``; float32)
    without any ``n_q x n_k`` array: one fused pass, memory O(n) beyond the inputs and a
    ``B x groups x ceil(n_q / 64) x 2 x n_k`` float scratch."""
    q, k, v, g = _common_dtype(q, k, v, g)
    kp = _check(q, k, mask, softcap)
    n_q = q.shape[2]
    start = n_q if read_from is None else max(0, min(int(read_from), n_q))
    key_sums, head_max = _ops().attr_key_sums(q, k, v, g, kp, stats, _scale(q, scale), bool(causal), start, _stream(q))
    result = {"key_sum": key_sums[:, 0], "total": key_sums[:, 0].sum(-1, dtype=torch.float64),
              "head_max": head_max}
    if read_from is not None:
        result["read_sum"] = key_sums[:, 1]
    return result


def attribution_from_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          mask: torch.Tensor | None = None, scale: float | None = None,
                          softcap: float | None = None, want_maps: bool = True, causal: bool = False,
                          stats: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Fused ``A * (G V^T)`` without storing A; same dict as ``reference.attribution_from_grad``.

    ``head_sum`` [B, n_q, n_k], ``head_max`` [B, H] and (if ``want_maps``) ``maps``
    [B, H, n_q, n_k], all float32.  ``stats`` from :func:`attention_forward_with_stats`
    on the same q, k, mask, scale and causal skips the statistics pass. Accumulates in float32;
    mixed dtypes as :func:`_common_dtype` takes them (kernels/README.md, "What the kernels do").
    """
    q, k, v, g = _common_dtype(q, k, v, g)
    kp = _check(q, k, mask, softcap)
    maps, head_sum, head_max = _ops().attr_from_grad(q, k, v, g, kp, stats, _scale(q, scale), bool(causal),
                                                     bool(want_maps), _stream(q))
    result = {"head_sum": head_sum, "head_max": head_max}
    if want_maps:
        result["maps"] = maps
    return result
