"""Tests of the fused CUDA attention / attribution kernels and the backend selector.

* compile checks that run without a GPU: ``nvcc -c`` of attattr_cli/kernels/attattr_attn.cu
  for sm_80 and sm_90, ``g++ -fsyntax-only`` of the binding attattr_cli/kernels/attattr_ops.cpp
  (the register / spill check is tests/test_ptxas.py);
* the backend selector on CPU;
* a CPU emulation of the kernels (slow): the .cu and the binding are rebuilt for the CPU
  with a small shim that runs each thread block on one OS thread, its 256 CUDA threads as
  fibers switched at every barrier (a phase loop), so the kernel logic (tiling, masks, online softmax, reductions, strides, op schema, fake
  implementations) is checked against the reference without a GPU;
* GPU tests (``-m gpu``) of the real kernels against the reference; they skip cleanly
  without CUDA.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import types
from pathlib import Path

import pytest
import torch

from attattr_cli.errors import OptionError
from attattr_cli.ops import BACKEND_KINDS, CudaBackend, TorchBackend, kernel, reference, select_backend

ROOT = Path(__file__).resolve().parents[1]
CU = ROOT / "attattr_cli" / "kernels" / "attattr_attn.cu"
CPP = ROOT / "attattr_cli" / "kernels" / "attattr_ops.cpp"
NVCC_FLAGS = [
    "-c",
    "-std=c++17",
    "-O3",
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=sm_90",
]

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
NEG = torch.finfo(torch.float32).min


def find_nvcc() -> str | None:
    toolkit = kernel.find_toolkit()
    return str(toolkit.nvcc) if toolkit is not None else None


def test_sources_ship_in_the_package():
    assert kernel.source_dir() == ROOT / "attattr_cli" / "kernels"
    assert [p.name for p in kernel.sources()] == ["attattr_attn.cu", "attattr_ops.cpp"]
    assert all(p.is_file() for p in kernel.sources())
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"kernels/*.cu"' in pyproject and '"kernels/*.cpp"' in pyproject


def test_toolkit_found_through_a_wrapper_script(tmp_path, monkeypatch):
    real = tmp_path / "cuda-99.1"
    (real / "bin").mkdir(parents=True)
    (real / "include").mkdir()
    (real / "include" / "cuda_runtime.h").write_text("")
    nvcc = real / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho fake\n")
    nvcc.chmod(0o755)
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    wrapper = wrappers / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {nvcc} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(wrappers))
    found = kernel.find_toolkit()
    assert found is not None and found.root == real and found.nvcc == nvcc
    assert str(wrapper) in found.how and str(real) in found.describe()
    # CUDA_PATH, then CUDA_HOME, win over PATH
    other = tmp_path / "other"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "nvcc").write_text("")
    monkeypatch.setenv("CUDA_PATH", str(other))
    assert kernel.find_toolkit().root == other and "CUDA_PATH" in kernel.find_toolkit().how
    monkeypatch.setenv("CUDA_HOME", str(real))
    assert kernel.find_toolkit().root == real and "CUDA_HOME" in kernel.find_toolkit().how


def test_arch_lists():
    assert kernel.normalize_arch_list("8.0 9.0") == "8.0;9.0"
    assert kernel.normalize_arch_list(" 8.0,8.6;9.0+PTX ") == "8.0;8.6;9.0+PTX"
    with pytest.raises(OptionError, match="architecture list"):
        kernel.normalize_arch_list("sm_80")
    assert kernel._arch_covers("8.0;9.0", (8, 9))  # sm_80 code runs on sm_89
    assert not kernel._arch_covers("8.0;9.0", (10, 0))
    assert kernel._arch_covers("8.0;9.0+PTX", (10, 0))  # PTX is JIT-compiled forward
    assert not kernel._arch_covers("9.0", (8, 0))


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the CPU-build behaviour")
def test_build_without_cuda_torch_explains(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    with pytest.raises(OptionError, match="architecture list"):
        kernel.build(verbose=False, arch_list="sm_90")
    with pytest.raises(kernel.KernelUnavailable, match="CPU-only build"):
        kernel.build(verbose=False, arch_list="8.0 9.0")
    assert "TORCH_CUDA_ARCH_LIST" not in os.environ  # set for the build only


def test_attribution_grid_fills_the_gpu():
    """BERT-base (12 heads) on a 132-SM GPU: the head groups give >= 48 blocks at n = 128."""
    grid = {n: kernel.attribution_grid(1, 12, n, n, sms=132) for n in (128, 512, 4096)}
    assert grid[128]["blocks"] >= 48 and grid[128]["heads_per_group"] == 1
    assert grid[512]["blocks"] >= 132  # at least one block per SM
    assert grid[4096] == {"heads_per_group": 12, "groups": 1, "blocks": 4096, "workspace_floats": 0}
    for n, plan in grid.items():
        tiles = (-(-n // 64)) ** 2
        assert plan["blocks"] == tiles * plan["groups"]
        assert plan["groups"] * plan["heads_per_group"] >= 12 > (plan["groups"] - 1) * plan["heads_per_group"]
        # the second pass's workspace stays small (a few MB)
        assert plan["workspace_floats"] * 4 <= 8 << 20


# ----------------------------------------------------------------- compile checks
def test_cu_has_no_torch_headers():
    text = CU.read_text()
    includes = re.findall(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]", text, flags=re.M)
    assert includes, "no #include found"
    bad = [inc for inc in includes if inc.split("/")[0] in ("torch", "ATen", "c10", "pybind11")]
    assert not bad, f"attattr_attn.cu must not include torch headers: {bad}"


def _torch_includes() -> list[str]:
    from torch.utils import cpp_extension

    paths = cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]
    return [arg for path in paths for arg in ("-isystem", path)]


def _needed(request, fixture: str) -> bool:
    """Whether a selected test uses ``fixture`` (itself or through another fixture)."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="module")
def cpp_compiles(request, tmp_path_factory):
    """The module's two compiles of the binding with the torch headers, side by side:
    ``g++ -fsyntax-only`` of the shipped attattr_ops.cpp (``binding_syntax``) runs in the
    background while the CPU emulation (``emulated``) is built.  Each spends ~20 s of one core
    parsing the torch headers, so on two cores both take about as long as one.  Each runs
    only when a selected test needs it.

    ``syntax``: (exit code, log), None without g++ or when not needed; ``emulation``: the
    build folder, or the exception the build raised, or a skip reason (a str)."""
    compiles = types.SimpleNamespace(syntax=None, emulation=None)
    gxx = shutil.which("g++")
    syntax = None
    if gxx is not None and _needed(request, "binding_syntax"):
        cmd = [gxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", *_torch_includes(), str(CPP)]
        log_path = tmp_path_factory.mktemp("binding_syntax") / "g++.log"
        log_file = log_path.open("w")
        syntax = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    try:
        if _needed(request, "emulated"):
            compiles.emulation = _build_emulation(tmp_path_factory)
    except BaseException:  # interrupted: g++ is not left running
        if syntax is not None:
            syntax.kill()
            syntax.wait()
        raise
    if syntax is not None:
        try:
            code = syntax.wait(timeout=600)
        except subprocess.TimeoutExpired:
            syntax.kill()
            syntax.wait()
            code = None
        log_file.close()
        log = log_path.read_text()
        compiles.syntax = (code, log if code is not None else log + "\n(timed out after 600 s)")
    return compiles


@pytest.fixture(scope="module")
def binding_syntax(cpp_compiles):
    """(exit code, log) of ``g++ -std=c++20 -fsyntax-only -Wall -Wextra`` of attattr_ops.cpp."""
    if cpp_compiles.syntax is None:
        pytest.skip("g++ not found")
    return cpp_compiles.syntax


def test_cpp_binding_syntax(binding_syntax):
    code, log = binding_syntax
    assert code == 0, f"g++ -fsyntax-only failed:\n{log}"
    assert "warning" not in log.lower(), log


# ----------------------------------------------------------------- selector (CPU)
@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("ATTATTR_KERNEL", raising=False)
    return monkeypatch


def test_kernel_module_never_raises_and_explains():
    ok = kernel.available()
    assert isinstance(ok, bool)
    reason = kernel.unavailable_reason()
    if ok:
        assert reason == ""
    else:
        assert reason and "ATTATTR_KERNEL=torch" in reason
        assert "ATTATTR_KERNEL" not in kernel.unavailable_reason(hint=False)


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only behaviour")
def test_auto_is_torch_without_cuda(clean_env):
    backend = select_backend()
    assert backend.name == "torch"
    assert select_backend("auto", device="cpu").name == "torch"
    assert select_backend("AUTO").name == "torch"


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only behaviour")
def test_cuda_kind_raises_with_reason(clean_env):
    with pytest.raises(OptionError) as info:
        select_backend("cuda")
    message = str(info.value)
    assert "cuda kernel backend is unavailable" in message
    assert kernel.unavailable_reason(hint=False) in message
    assert "torch backend" in message
    assert ("CPU-only build" in message) or ("no CUDA device" in message)


def test_torch_kind(clean_env):
    backend = select_backend("torch")
    assert backend.name == "torch"
    assert isinstance(backend, TorchBackend)
    q = torch.randn(1, 1, 3, 4)
    assert backend.supports(q, None, softcap=30.0)


def test_unknown_kind_lists_choices(clean_env):
    with pytest.raises(OptionError) as info:
        select_backend("triton")
    message = str(info.value)
    assert "triton" in message
    for kind in BACKEND_KINDS:
        assert kind in message


def test_bad_env_value(clean_env):
    clean_env.setenv("ATTATTR_KERNEL", "fast")
    with pytest.raises(OptionError, match="ATTATTR_KERNEL"):
        select_backend("auto")


def test_env_var_respected(clean_env):
    # Pretend the kernels are available, so only the env var decides.
    clean_env.setattr(kernel, "available", lambda: True)
    assert select_backend("auto", device="cuda").name == "cuda"
    assert select_backend("auto", device="cpu").name == "torch"
    clean_env.setenv("ATTATTR_KERNEL", "torch")
    assert select_backend("auto", device="cuda").name == "torch"
    assert select_backend("cuda", device="cuda").name == "cuda"  # an explicit kind wins
    clean_env.setenv("ATTATTR_KERNEL", "cuda")
    assert select_backend("auto", device="cuda").name == "cuda"
    with pytest.raises(OptionError, match="needs a CUDA device"):
        select_backend("auto", device="cpu")


def test_auto_warns_when_kernel_fails_on_cuda(clean_env):
    clean_env.setattr(kernel, "available", lambda: False)
    clean_env.setattr(kernel, "unavailable_reason", lambda hint=True: "build failed: boom (test)")
    with pytest.warns(RuntimeWarning, match="build failed: boom"):
        backend = select_backend("auto", device="cuda")
    assert backend.name == "torch"


def test_cuda_backend_routes_unsupported_to_reference(clean_env):
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(4))
    backend = CudaBackend()
    assert not backend.supports(q)  # CPU tensors
    got = backend.attribution_from_grad(q, k, v, g, softcap=20.0)
    want = reference.attribution_from_grad(q, k, v, g, softcap=20.0)
    for key in want:
        torch.testing.assert_close(got[key], want[key])
    torch.testing.assert_close(backend.attention_forward(q, k, v), reference.attention_forward(q, k, v))


def test_kernel_wrappers_refuse_clearly():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(kernel.KernelUnsupported, match="softcap"):
        kernel.attribution_from_grad(q, q, q, q, softcap=30.0)
    with pytest.raises(kernel.KernelUnsupported, match="not on a CUDA device"):
        kernel.attention_forward(q, q, q)
    with pytest.raises(kernel.KernelUnsupported, match="key-padding mask"):
        kernel.key_padding_mask(torch.zeros(1, 1, 4, 4), 1, 4)
    with pytest.raises(kernel.KernelUnsupported, match="key-padding mask"):
        kernel.key_padding_mask(torch.zeros(2, 4), 3, 4)
    assert kernel.key_padding_mask(torch.zeros(1, 1, 1, 4), 1, 4).shape == (1, 4)
    assert kernel.key_padding_mask(torch.zeros(3, 4), 3, 4).shape == (3, 4)
    assert not kernel.supports(q.to(torch.float64))


def _causal_truth_mask(pad, n_q, n_k, batch):
    m = torch.zeros(batch, 1, n_q, n_k, dtype=torch.float64)
    if pad is not None:
        m = m + pad.double()[:, None, None, :]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    return m.masked_fill(~allowed, float("-inf"))


def test_torch_backend_key_padding_and_causal():
    torch.manual_seed(1)
    b, h, n, d = 2, 3, 6, 4
    q, k, v, g = (torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(4))
    pad = torch.zeros(b, n, dtype=torch.float64)
    pad[1, 4:] = NEG
    backend = TorchBackend()
    got = backend.attribution_from_grad(q, k, v, g, pad, causal=True)
    want = reference.attribution_from_grad(q, k, v, g, _causal_truth_mask(pad, n, n, b))
    for key in want:
        torch.testing.assert_close(got[key], want[key])
    # the causal maps are zero above the diagonal
    assert torch.all(got["maps"].triu(1) == 0)
    o = backend.attention_forward(q, k, v, pad, causal=True)
    a = reference.attention_probs(q, k, _causal_truth_mask(pad, n, n, b))
    torch.testing.assert_close(o, a @ v)
    # [B, 1, 1, n_k] is the same as [B, n_k]
    got4 = backend.attribution_from_grad(q, k, v, g, pad[:, None, None, :], causal=True)
    torch.testing.assert_close(got4["head_sum"], got["head_sum"])


def test_reference_upcasts_half_inputs_to_float32():
    """A bfloat16 model's q, k, v with the float32 integral G: everything after the inputs'
    own rounding is float32 (scores, softmax, G V^T), as if the inputs were upcast first."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 3, 9, 16).to(torch.bfloat16) for _ in range(3))
    g = torch.randn(2, 3, 9, 16)
    pad = torch.zeros(2, 1, 1, 9)
    pad[1, ..., 6:] = NEG
    got = reference.attribution_from_grad(q, k, v, g, pad)
    want = reference.attribution_from_grad(q.float(), k.float(), v.float(), g, pad)
    for key in want:
        assert got[key].dtype == torch.float32
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    truth = _truth(q, k, v, g, pad[:, 0, 0], False)
    torch.testing.assert_close(got["maps"].double(), truth["maps"], atol=1e-5, rtol=1e-5)


def test_reference_attention_forward_matches_sdpa():
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 3, 7, 16) for _ in range(3))
    o = reference.attention_forward(q, k, v, causal=True)
    torch.testing.assert_close(o, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


# ------------------------------------------------------- CPU emulation of the kernels
EMU_NAMESPACE = "attattr_emu"

EMU_SHIM = r"""
// CPU emulation of the CUDA features used by attattr_attn.cu (test harness only).
// A block runs on ONE OS thread, the launching one: its blockDim.x CUDA threads are fibers
// (ucontext stacks) that the block's scheduler runs one after another, thread 0 first; a
// fiber runs until its next __syncthreads (or its end), so the block advances phase by
// phase between barriers, in a fixed order: no OS threads, no locks, no OS scheduling.
// A barrier that some fibers reach while others have returned is reported as a launch
// error (cudaGetLastError), not a deadlock.  Warp shuffles go through a block-wide
// exchange buffer (every call site is block-uniform); each block gets fresh, NaN-poisoned
// shared memory.  The device has $ATTATTR_EMU_SMS multiprocessors (default 4); every
// launch's grid is logged for emu_launches(), and the process's OS thread count while a
// block's fibers are all alive (at their first barrier) for emu_peak_threads().
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
using std::max;
using std::min;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct emu_index { unsigned x, y, z; };
static emu_index threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static std::vector<unsigned> emu_grid_log;
static float* emu_smem = nullptr;
static float emu_shfl[2][1024];
static unsigned emu_shfl_calls[1024];
static std::mutex emu_launch_mu;
static int emu_error = 0;  // sticky until cudaGetLastError
static int emu_peak = 0;   // OS threads of the process seen while a block runs
// ------------------------------------------------------------------ fibers
// x86-64: a 10-instruction switch of the callee-saved registers, the stack pointer and the
// SSE / x87 control words (glibc's swapcontext also saves the signal mask: two system
// calls per switch); elsewhere, or with -DATTATTR_EMU_UCONTEXT, ucontext.
enum emu_state { EMU_RUNNING, EMU_AT_BARRIER, EMU_DONE };
constexpr size_t kEmuStack = 256 * 1024;  // per fiber, with a guard page below
static std::vector<char*> emu_stacks;
static unsigned emu_cur = 0;
static const std::function<void()>* emu_body = nullptr;
#if defined(__x86_64__) && !defined(ATTATTR_EMU_UCONTEXT)
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .local emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");
struct emu_fiber {
  void* sp;
  emu_state state;
};
static std::vector<emu_fiber> emu_fibers;
static void* emu_sched_sp = nullptr;
[[noreturn]] static void emu_fiber_main() {
  (*emu_body)();
  emu_fibers[emu_cur].state = EMU_DONE;
  emu_switch(&emu_fibers[emu_cur].sp, emu_sched_sp);  // never resumed
  __builtin_unreachable();
}
static void emu_fiber_start(emu_fiber& f, char* stack) {
  uint64_t* sp = reinterpret_cast<uint64_t*>(stack + kEmuStack);  // 16-byte aligned
  *--sp = 0;                                                      // emu_fiber_main's return address
  *--sp = reinterpret_cast<uint64_t>(&emu_fiber_main);            // emu_switch returns here
  for (int r = 0; r < 6; ++r) *--sp = 0;                          // rbp rbx r12 .. r15
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--sp = (uint64_t)mxcsr | ((uint64_t)fpucw << 32);
  f.sp = sp;
}
static void emu_fiber_resume(emu_fiber& f) { emu_switch(&emu_sched_sp, f.sp); }
static void emu_fiber_yield(emu_fiber& f) { emu_switch(&f.sp, emu_sched_sp); }
#else
struct emu_fiber {
  ucontext_t ctx;
  emu_state state;
};
static std::vector<emu_fiber> emu_fibers;
static ucontext_t emu_sched;
static void emu_fiber_main() {
  (*emu_body)();
  emu_fibers[emu_cur].state = EMU_DONE;  // returns to uc_link, the scheduler
}
static void emu_fiber_start(emu_fiber& f, char* stack) {
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack;
  f.ctx.uc_stack.ss_size = kEmuStack;
  f.ctx.uc_link = &emu_sched;
  makecontext(&f.ctx, emu_fiber_main, 0);
}
static void emu_fiber_resume(emu_fiber& f) { swapcontext(&emu_sched, &f.ctx); }
static void emu_fiber_yield(emu_fiber& f) { swapcontext(&f.ctx, &emu_sched); }
#endif
inline void __syncthreads() {
  emu_fiber& f = emu_fibers[emu_cur];
  f.state = EMU_AT_BARRIER;
  emu_fiber_yield(f);
}
static int emu_os_threads() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int n = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "Threads:", 8) == 0) n = std::atoi(line + 8);
  std::fclose(f);
  return n;
}
// Runs one block: nt fibers executing body(), phase by phase.  false on barrier divergence.
static bool emu_run_block(unsigned nt, const std::function<void()>& body, bool sample) {
  while (emu_stacks.size() < nt) {
    void* mem = mmap(nullptr, kEmuStack + 4096, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) std::abort();
    mprotect(mem, 4096, PROT_NONE);  // a stack overflow faults instead of corrupting
    emu_stacks.push_back(static_cast<char*>(mem) + 4096);
  }
  emu_fibers.resize(std::max<size_t>(emu_fibers.size(), nt));
  emu_body = &body;
  for (unsigned t = 0; t < nt; ++t) {
    emu_fiber_start(emu_fibers[t], emu_stacks[t]);
    emu_fibers[t].state = EMU_RUNNING;
  }
  for (unsigned phase = 0;; ++phase) {
    unsigned waiting = 0, done = 0;
    for (unsigned t = 0; t < nt; ++t) {
      emu_fiber& f = emu_fibers[t];
      if (f.state == EMU_DONE) { ++done; continue; }
      threadIdx = {t, 0, 0};
      emu_cur = t;
      f.state = EMU_RUNNING;
      emu_fiber_resume(f);
      if (f.state == EMU_AT_BARRIER) ++waiting; else ++done;
    }
    if (sample && phase == 0) emu_peak = std::max(emu_peak, emu_os_threads());
    if (done == nt) return true;
    if (waiting != nt) return false;  // some threads wait at a barrier others never reach
  }
}
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  // Two exchange buffers used in turn, one barrier per shuffle: a thread writes a buffer
  // again two shuffles later, past the next shuffle's barrier, which no thread reaches
  // before it has read this one.
  const int t = (int)threadIdx.x;
  float* buf = emu_shfl[emu_shfl_calls[t]++ & 1u];
  buf[t] = v;
  __syncthreads();
  return buf[(t & ~31) | ((t & 31) ^ lane_mask)];
}
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
struct __half { uint16_t x; };
struct __nv_bfloat16 { uint16_t x; };
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.x, 2); return (float)f; }
inline __half __float2half_rn(float x) {
  _Float16 f = (_Float16)x; __half h; std::memcpy(&h.x, &f, 2); return h;
}
inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.x << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  uint32_t u; std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  __nv_bfloat16 b; b.x = (uint16_t)(u >> 16); return b;
}
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
// ------------------------------------------- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}
// The warp-wide instruction as the kernels call it, d += A B: every thread deposits its
// fragment registers, a barrier (the call sites are block-uniform, like the shuffles'),
// then each thread rebuilds its warp's A (16 x 16), B (16 x 8) and C (16 x 8) from the 32
// lanes' registers with the layout of the PTX ISA ("Matrix Fragments for mma.m16n8k16
// with floating point type"; groupID = lane >> 2, threadID_in_group = lane % 4; in each
// .b32 register the lower-indexed element in the low 16 bits) and computes its own four
// D entries.  A kernel whose fragments follow another layout gets wrong products here.
// The products of two half values are exact in float; the sum runs in k order in float
// (the ISA leaves the hardware's order and internal precision open).
#define ATTATTR_EMU_MMA 1
struct emu_mma_regs { uint32_t a[4], b[2]; float c[4]; };
static emu_mma_regs emu_mma_x[2][1024];
static unsigned emu_mma_calls[1024];
static unsigned long long emu_mma_count = 0;  // warp-level instructions issued
template <class T> inline float emu_half_value(uint32_t bits);
template <> inline float emu_half_value<__half>(uint32_t bits) {
  __half h; h.x = (uint16_t)bits; return __half2float(h);
}
template <> inline float emu_half_value<__nv_bfloat16>(uint32_t bits) {
  __nv_bfloat16 b; b.x = (uint16_t)bits; return __bfloat162float(b);
}
template <class T>
void attattr_emu_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const unsigned t = threadIdx.x;
  emu_mma_regs* x = emu_mma_x[emu_mma_calls[t]++ & 1u];  // two buffers, as for the shuffles
  std::memcpy(x[t].a, a, sizeof x[t].a);
  std::memcpy(x[t].b, b, sizeof x[t].b);
  std::memcpy(x[t].c, d, sizeof x[t].c);
  if ((t & 31u) == 0) ++emu_mma_count;
  __syncthreads();
  const emu_mma_regs* warp = x + (t & ~31u);
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane >> 2, tig = lane % 4;
    for (int i = 0; i < 8; ++i) {  // a0 .. a7: register i / 2, half i % 2
      const int row = group + ((i < 2 || (4 <= i && i < 6)) ? 0 : 8);
      const int col = tig * 2 + (i & 1) + (i < 4 ? 0 : 8);
      A[row][col] = emu_half_value<T>(warp[lane].a[i >> 1] >> (16 * (i & 1)));
    }
    for (int i = 0; i < 4; ++i) {  // b0 .. b3: register i / 2, half i % 2
      const int row = tig * 2 + (i & 1) + (i < 2 ? 0 : 8);
      B[row][group] = emu_half_value<T>(warp[lane].b[i >> 1] >> (16 * (i & 1)));
    }
    for (int i = 0; i < 4; ++i) {  // c0 .. c3
      const int row = group + (i < 2 ? 0 : 8);
      C[row][tig * 2 + (i & 1)] = warp[lane].c[i];
    }
  }
  const int lane = (int)(t & 31u), group = lane >> 2, tig = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = group + (i < 2 ? 0 : 8), col = tig * 2 + (i & 1);
    float acc = C[row][col];
    for (int k = 0; k < 16; ++k) acc = std::fma(A[row][k], B[k][col], acc);
    d[i] = acc;
  }
}
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorLaunchFailure = 719 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount };
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return 0; }
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) {
  const char* sms = std::getenv("ATTATTR_EMU_SMS");
  *value = sms != nullptr ? std::atoi(sms) : 4;
  return 0;
}
extern "C" int emu_launches(unsigned* out, int max_launches) {
  const int n = (int)emu_grid_log.size() / 3;
  for (int i = 0; i < n && i < max_launches; ++i)
    for (int c = 0; c < 3; ++c) out[3 * i + c] = emu_grid_log[3 * i + c];
  emu_grid_log.clear();
  return n;
}
// The largest OS thread count of the process seen while a launch ran (then reset).
extern "C" int emu_peak_threads() { const int p = emu_peak; emu_peak = 0; return p; }
typedef void* cudaStream_t;
template <class F> cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return 0; }
inline cudaError_t cudaGetLastError() { const int e = emu_error; emu_error = 0; return e; }
inline const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaErrorLaunchFailure)
    return "emulation: some threads of a block wait at a __syncthreads that others never reach";
  return e ? "invalid argument" : "no error";
}
// Releases the fibers' stacks (the fixture's teardown); a later launch maps new ones.
extern "C" void emu_shutdown() {
  std::lock_guard<std::mutex> no_launch_meanwhile(emu_launch_mu);
  for (char* s : emu_stacks) munmap(s - 4096, kEmuStack + 4096);
  emu_stacks.clear();
  emu_fibers.clear();
}
template <class... KArgs, class... Args>
void emu_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
                Args... args) {
  std::lock_guard<std::mutex> one_launch_at_a_time(emu_launch_mu);
  emu_grid_log.insert(emu_grid_log.end(), {grid.x, grid.y, grid.z});
  const unsigned nt = block.x * block.y * block.z;
  // Poison shared memory so that reading a slot nobody wrote shows up as NaN, again
  // before every block.
  std::vector<float> sm(smem / sizeof(float) + 1, std::nanf(""));
  emu_smem = sm.data();
  blockDim = block;
  gridDim = grid;
  const std::function<void()> body = [&] { kern(args...); };
  bool first = true;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        std::fill(sm.begin(), sm.end(), std::nanf(""));
        std::fill(emu_shfl_calls, emu_shfl_calls + nt, 0u);
        std::fill(emu_mma_calls, emu_mma_calls + nt, 0u);
        if (!emu_run_block(nt, body, first)) {
          emu_error = cudaErrorLaunchFailure;
          return;
        }
        first = false;
      }
}
// Self-test of the barrier check: thread 0 returns while the others wait at a barrier.
static void emu_divergent_kernel(int* out) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
extern "C" int emu_selftest_divergence() {
  static int out[256];
  emu_launch(emu_divergent_kernel, dim3(2), dim3(256), 0, nullptr, out);
  return cudaGetLastError();
}
// One warp runs the emulated mma on given fragments: a [32][4], b [32][2], c and d [32][4].
template <class T>
static void emu_mma_kernel(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  const unsigned l = threadIdx.x;
  const uint32_t fa[4] = {a[4 * l], a[4 * l + 1], a[4 * l + 2], a[4 * l + 3]};
  const uint32_t fb[2] = {b[2 * l], b[2 * l + 1]};
  float fd[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
  attattr_emu_mma<T>(fd, fa, fb);
  for (int i = 0; i < 4; ++i) d[4 * l + i] = fd[i];
}
extern "C" int emu_mma_selftest(int bf16, const uint32_t* a, const uint32_t* b, const float* c,
                                float* d) {
  if (bf16) emu_launch(emu_mma_kernel<__nv_bfloat16>, dim3(1), dim3(32), 0, nullptr, a, b, c, d);
  else emu_launch(emu_mma_kernel<__half>, dim3(1), dim3(32), 0, nullptr, a, b, c, d);
  return cudaGetLastError();
}
// Warp-level mma instructions emulated since the last call.
extern "C" unsigned long long emu_mma_instructions() {
  const unsigned long long n = emu_mma_count; emu_mma_count = 0; return n;
}
"""


def _substitute(text: str, old: str, new: str, what: str) -> str:
    assert old in text, f"emulation harness out of date: {what!r} not found in the sources"
    return text.replace(old, new)


def _emulation_sources(folder: Path) -> list[Path]:
    cu = CU.read_text()
    cu = re.sub(r"#include <cuda[^>]*>\n", "", cu)
    cu = _substitute(cu, "extern __shared__ float smem[];", "float* smem = emu_smem;", "smem")
    cu, launches = re.subn(r"(\w+)<<<(.+?)>>>\(", r"emu_launch(\1, \2, ", cu)
    assert launches >= 2, "emulation harness out of date: kernel launches not found"
    cpp = CPP.read_text()
    cpp = _substitute(cpp, "TORCH_LIBRARY(attattr,", f"TORCH_LIBRARY({EMU_NAMESPACE},", "TORCH_LIBRARY")
    cpp = _substitute(
        cpp, "TORCH_LIBRARY_IMPL(attattr, CUDA,", f"TORCH_LIBRARY_IMPL({EMU_NAMESPACE}, CPU,", "IMPL"
    )
    cpp = re.sub(r"\b\w+\.is_cuda\(\)", "true", cpp)
    cpp = _substitute(
        cpp,
        "c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);\n"
        "  return impl.getStream(q.device()).native_handle();",
        "return nullptr;",
        "resolve_stream",
    )
    for name in ("attattr_attn_forward", "attattr_attr_from_grad", "attattr_attr_key_sums", "attattr_attr_plan",
                 "attattr_error_string"):
        cu = cu.replace(name, "emu_" + name)
        cpp = cpp.replace(name, "emu_" + name)
    (folder / "emu_cuda.h").write_text(EMU_SHIM)
    attn = folder / "emu_attn.cpp"
    attn.write_text('#include "emu_cuda.h"\n' + cu)
    ops = folder / "emu_ops.cpp"
    ops.write_text(cpp)
    return [ops, attn]


def _build_emulation(tmp_path_factory) -> Path | str | Exception:
    """Build (and load) the emulation: its folder, a skip reason, or the build's exception."""
    if sys.platform != "linux" or shutil.which("g++") is None or shutil.which("ninja") is None:
        return "the CPU emulation needs Linux, g++ and ninja"
    from torch.utils import cpp_extension

    folder = tmp_path_factory.mktemp("attattr_emu")
    try:
        # -O1: the tests run as fast as at -O2 (they wait at barriers), the build is ~4 s shorter
        cpp_extension.load(
            name="attattr_emu",
            sources=[str(p) for p in _emulation_sources(folder)],
            extra_cflags=["-O1", "-w"],
            extra_include_paths=[str(folder)],
            build_directory=str(folder),
            is_python_module=False,
            verbose=False,
        )
    except Exception as error:  # raised again by `emulated`, not by the syntax check
        return error
    return folder


@pytest.fixture(scope="module")
def emulated(cpp_compiles):
    """The kernels and binding built for the CPU (ops in the attattr_emu namespace)."""
    folder = cpp_compiles.emulation
    if isinstance(folder, str):
        pytest.skip(folder)
    if isinstance(folder, Exception):
        raise folder
    kernel._register_fakes(EMU_NAMESPACE)
    ops = getattr(torch.ops, EMU_NAMESPACE)
    ops.library = ctypes.CDLL(str(folder / "attattr_emu.so"))
    yield ops
    ops.library.emu_shutdown()  # the fibers' stacks are unmapped with the module



def _os_threads() -> int:
    """OS threads of this process now (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line in /proc/self/status")


@pytest.mark.slow
def test_emulation_runs_blocks_on_the_launching_thread(emulated):
    """A block's 256 CUDA threads are fibers on the calling OS thread: a launch starts no OS
    thread (counted from /proc/self/status while a block's fibers are all alive), so the
    emulation never holds more than the process's own few threads, whatever the load."""
    q, k, v, g = _inputs(2, 3, 70, 70, 64, torch.float32, seed=4)
    emulated.library.emu_peak_threads()  # reset
    before = _os_threads()
    emulated.attr_from_grad(q, k, v, g, None, None, 0.125, False, True, 0)
    peak = emulated.library.emu_peak_threads()
    assert 0 < peak <= before, f"{peak} OS threads during the launch, {before} before"
    if torch.get_num_threads() <= 4:  # torch's own intra-op pool aside
        assert peak <= 8, f"{peak} OS threads during an emulated launch"
    # a __syncthreads that one thread of a block never reaches: an error, not a hang
    assert emulated.library.emu_selftest_divergence() == 719
    assert _os_threads() <= before


def _launch_grids(emulated) -> list[tuple[int, int, int]]:
    """The grids of the emulated launches since the last call."""
    out = (ctypes.c_uint * 300)()
    count = emulated.library.emu_launches(out, 100)
    return [tuple(out[3 * i : 3 * i + 3]) for i in range(min(count, 100))]


@pytest.fixture
def emulated_wrappers(emulated, monkeypatch):
    """kernel.py's wrappers and CudaBackend running on the CPU emulation."""
    monkeypatch.setattr(kernel, "OP_NAMESPACE", EMU_NAMESPACE)
    monkeypatch.setattr(kernel, "_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(kernel, "_require_loaded", lambda: None)
    return kernel


def _inputs(b, h, n_q, n_k, d, dtype, seed=0, strided=True):
    gen = torch.Generator().manual_seed(seed)
    if strided:  # q and g as views of [B, n, H, d], like a transformer's activations
        q = torch.randn(b, n_q, h, d, generator=gen).transpose(1, 2)
        g = torch.randn(b, n_q, h, d, generator=gen).transpose(1, 2)
    else:
        q = torch.randn(b, h, n_q, d, generator=gen)
        g = torch.randn(b, h, n_q, d, generator=gen)
    k = torch.randn(b, h, n_k, d, generator=gen)
    v = torch.randn(b, h, n_k, d, generator=gen)
    return tuple(t.to(dtype) for t in (q, k, v, g))


def _padding(b, n_k, device="cpu", full_row=True):
    """Key padding: item 0 unpadded, item 1 padded past the middle, item 2 fully padded."""
    pad = torch.zeros(b, n_k, device=device)
    if b > 1:
        pad[1, n_k // 2 + 1 :] = NEG
    if b > 2 and full_row:
        pad[2, :] = NEG
    return pad


def _truth(q, k, v, g, pad, causal):
    """float64 reference from the same (rounded) inputs; rows with no allowed key -> 0."""
    q64, k64, v64, g64 = (t.double() for t in (q, k, v, g))
    n_q, n_k = q.shape[2], k.shape[2]
    m = torch.zeros(q.shape[0], 1, n_q, n_k, dtype=torch.float64, device=q.device)
    if pad is not None:
        m = m + pad.double()[:, None, None, :]
    if causal:
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        m = m.masked_fill(~allowed, float("-inf"))
    probs = reference.attention_probs(q64, k64, m).nan_to_num(0.0)
    maps = probs * (g64 @ v64.transpose(-1, -2))
    return {
        "o": probs @ v64,
        "maps": maps,
        "head_sum": maps.sum(1),
        "head_max": maps.flatten(2).amax(-1),
    }


EMU_CASES = [
    # (batch, heads, n_q, n_k, d_head)
    (1, 2, 1, 1, 32),
    (3, 2, 7, 7, 64),
    (3, 2, 70, 70, 80),
    (2, 2, 65, 65, 128),
    (1, 2, 5, 70, 48),  # n_q < n_k
    (1, 2, 70, 5, 64),  # n_q > n_k: with causal, rows without any allowed key
    (2, 5, 40, 40, 32),  # 3 head groups of 2, 2 and 1 heads (4 emulated SMs)
]


@pytest.mark.slow
@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: "x".join(map(str, c)))
def test_emulated_kernels_match_reference(emulated, case):
    b, h, n_q, n_k, d = case
    scale = d**-0.5
    for dtype, masked, causal in itertools.product(
        (torch.float32, torch.bfloat16), (False, True), (False, True)
    ):
        if dtype == torch.bfloat16 and n_q * n_k > 1000 and not (masked and causal):
            continue  # keep the emulation quick; bf16 is covered by the smaller cases
        q, k, v, g = _inputs(b, h, n_q, n_k, d, dtype, seed=n_q + d)
        pad = _padding(b, n_k) if masked else None
        truth = _truth(q, k, v, g, pad, causal)
        o, stats = emulated.attn_forward(q, k, v, pad, scale, causal, 0)
        maps, head_sum, head_max = emulated.attr_from_grad(q, k, v, g, pad, None, scale, causal, True, 0)
        label = f"{dtype} mask={masked} causal={causal}"
        assert o.dtype == dtype and o.shape == (b, h, n_q, d)
        assert stats.shape == (b, h, n_q, 2) and stats.dtype == torch.float32
        o_tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(o.double(), truth["o"], atol=o_tol * 4, rtol=o_tol, msg=label)
        for name, got in (("maps", maps), ("head_sum", head_sum), ("head_max", head_max)):
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), truth[name], atol=2e-5, rtol=2e-5, msg=f"{label} {name}")
        # reusing the forward statistics gives the same result, bit for bit
        _launch_grids(emulated)
        maps2, head_sum2, head_max2 = emulated.attr_from_grad(q, k, v, g, pad, stats, scale, causal, False, 0)
        assert maps2.shape == (0,)
        assert torch.equal(head_sum2, head_sum) and torch.equal(head_max2, head_max)
        # the launches: the attribution grid of the plan, then the second pass(es)
        plan = kernel.attribution_grid(b, h, n_q, n_k, sms=4)
        grids = _launch_grids(emulated)
        assert grids[0] == (-(-n_k // 64), -(-n_q // 64), b * plan["groups"])
        assert len(grids) == (3 if plan["groups"] > 1 else 2)



# ------------------------------------------------ tensor-core path in the emulation
def _half_bits(x: torch.Tensor, dtype: torch.dtype) -> list[int]:
    return [int(v) & 0xFFFF for v in x.to(dtype).view(torch.int16).flatten().tolist()]


def _mma_fragments(a, b, c, dtype, wrong=None):
    """Per-lane registers of mma.m16n8k16 (.f16 / .bf16 A and B, .f32 C) built from the PTX
    ISA's formulas (groupID = lane >> 2, threadID_in_group = lane % 4), or with one
    ``wrong`` layout: "a_rows" (a2, a3 and a4, a5 swapped: the +8 on the column where the row
    wants it) or "b_transposed" (B's row and column exchanged)."""
    a_bits = _half_bits(a, dtype)  # [16][16] row major
    b_bits = _half_bits(b, dtype)  # [16][8]
    fa = [[0] * 4 for _ in range(32)]
    fb = [[0] * 2 for _ in range(32)]
    fc = [[0.0] * 4 for _ in range(32)]
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(8):
            row = group + (0 if (i < 2 or 4 <= i < 6) else 8)
            col = tig * 2 + (i & 1) + (0 if i < 4 else 8)
            if wrong == "a_rows" and i in (2, 3, 4, 5):
                row, col = group + (8 if i >= 4 else 0), tig * 2 + (i & 1) + (8 if i < 4 else 0)
            fa[lane][i >> 1] |= a_bits[row * 16 + col] << (16 * (i & 1))
        for i in range(4):
            k, n = tig * 2 + (i & 1) + (0 if i < 2 else 8), group
            if wrong == "b_transposed":
                k, n = (group + (0 if i < 2 else 8)), tig * 2 + (i & 1)
            fb[lane][i >> 1] |= b_bits[k * 8 + n] << (16 * (i & 1))
        for i in range(4):
            fc[lane][i] = float(c[group + (0 if i < 2 else 8), tig * 2 + (i & 1)])
    return fa, fb, fc


def _emulated_mma(emulated, fa, fb, fc, dtype) -> torch.Tensor:
    """D [16, 8] from the emulated instruction, read back through the PTX ISA's C/D layout."""
    flat_a = (ctypes.c_uint32 * 128)(*[r for lane in fa for r in lane])
    flat_b = (ctypes.c_uint32 * 64)(*[r for lane in fb for r in lane])
    flat_c = (ctypes.c_float * 128)(*[r for lane in fc for r in lane])
    out = (ctypes.c_float * 128)()
    code = emulated.library.emu_mma_selftest(int(dtype == torch.bfloat16), flat_a, flat_b, flat_c, out)
    assert code == 0
    d = torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(4):
            d[group + (0 if i < 2 else 8), tig * 2 + (i & 1)] = out[4 * lane + i]
    return d


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_emulated_mma_follows_the_ptx_fragment_layout(emulated, dtype):
    """The emulation's mma.m16n8k16 against a plain matmul, its fragments laid out as the
    PTX ISA documents; a wrong layout of A or of B gives a wrong product (so a kernel that
    builds its fragments another way fails the emulated kernel tests)."""
    gen = torch.Generator().manual_seed(53)
    a = torch.randn(16, 16, generator=gen).to(dtype).double()
    b = torch.randn(16, 8, generator=gen).to(dtype).double()
    c = torch.randn(16, 8, generator=gen).float().double()
    want = a @ b + c
    got = _emulated_mma(emulated, *_mma_fragments(a, b, c, dtype), dtype)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-6)
    for wrong in ("a_rows", "b_transposed"):
        bad = _emulated_mma(emulated, *_mma_fragments(a, b, c, dtype, wrong=wrong), dtype)
        assert (bad - want).abs().max() > 0.1, wrong


TENSOR_CORE_CASES = [
    # (batch, heads, n_q, n_k, d_head)
    (3, 2, 70, 70, 80),  # partial tiles, d padded to 96 (6 k-steps of 16)
    (1, 2, 33, 129, 32),  # n_q < n_k, three key tiles
    (2, 5, 40, 40, 128),  # head groups; 8 k-steps
]


@pytest.mark.slow
@pytest.mark.parametrize("case", TENSOR_CORE_CASES, ids=lambda c: "x".join(map(str, c)))
def test_emulated_tensor_core_path_matches_reference(emulated, case, monkeypatch):
    """float16 / bfloat16 inputs on the tensor-core path (the emulated mma.sync) agree with
    the float64 reference as closely as the fp32 path does (the products of half values are
    exact in float); ATTATTR_TENSOR_CORES=0 takes the fp32 path, with no mma at all."""
    b, h, n_q, n_k, d = case
    scale = d**-0.5
    emulated.library.emu_mma_instructions.restype = ctypes.c_ulonglong
    for dtype, masked, causal in ((torch.bfloat16, True, False), (torch.float16, True, True), (torch.bfloat16, False, True)):
        q, k, v, g = _inputs(b, h, n_q, n_k, d, dtype, seed=n_q * 7 + d)
        pad = _padding(b, n_k) if masked else None
        truth = _truth(q, k, v, g, pad, causal)
        results = {}
        for tensor_cores in ("1", "0"):
            monkeypatch.setenv("ATTATTR_TENSOR_CORES", tensor_cores)
            emulated.library.emu_mma_instructions()
            o, stats = emulated.attn_forward(q, k, v, pad, scale, causal, 0)
            maps, head_sum, head_max = emulated.attr_from_grad(q, k, v, g, pad, None, scale, causal, True, 0)
            count = emulated.library.emu_mma_instructions()
            label = f"{dtype} mask={masked} causal={causal} tensor_cores={tensor_cores}"
            if tensor_cores == "1":
                # forward (Q K^T) twice (stats inside attr_from_grad), attribution (Q K^T, G V^T)
                assert count > 0, label
            else:
                assert count == 0, label
            torch.testing.assert_close(o.double(), truth["o"], atol=4e-2, rtol=1e-2, msg=label)
            for name, got in (("maps", maps), ("head_sum", head_sum), ("head_max", head_max)):
                torch.testing.assert_close(got.double(), truth[name], atol=2e-5, rtol=2e-5, msg=f"{label} {name}")
            results[tensor_cores] = (stats, maps)
        # the two paths differ only by the float rounding of the sums
        for got, ref in zip(results["1"], results["0"]):
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)

def _plan(emulated, b, h, n_q, n_k, sms):
    per_group, workspace, partials = ctypes.c_int(), ctypes.c_longlong(), ctypes.c_longlong()
    code = emulated.library.emu_attattr_attr_plan(
        b, h, n_q, n_k, sms, ctypes.byref(per_group), ctypes.byref(workspace), ctypes.byref(partials)
    )
    assert code == 0
    return per_group.value, workspace.value, partials.value



@pytest.mark.slow
def test_emulated_split_g_path_keeps_the_float32_integral(emulated, emulated_wrappers, monkeypatch):
    """bfloat16 q, k, v with a float32 G (the engine's bf16 scoring): on tensor cores the
    kernel splits G into three bfloat16 parts (exact), so the result is the float64 truth of
    the float32 G to the fp32 path's tolerance, not of G rounded to bfloat16; without tensor
    cores the binding upcasts q, k, v (no mma).  The wrapper passes the mix through."""
    emulated.library.emu_mma_instructions.restype = ctypes.c_ulonglong
    b, h, n, d = 2, 3, 70, 64
    q, k, v, _ = _inputs(b, h, n, n, d, torch.bfloat16, seed=31)
    g32 = torch.randn(b, h, n, d, generator=torch.Generator().manual_seed(32)) * 1e-3  # small, like an integral
    pad = _padding(b, n, full_row=False)
    truth = _truth(q, k, v, g32, pad, True)
    rounded = _truth(q, k, v, g32.to(torch.bfloat16), pad, True)
    # G rounded to bfloat16 would miss the truth by far more than the tolerance below
    assert (rounded["maps"] - truth["maps"]).abs().max() > 20 * 2e-5 * truth["maps"].abs().max()
    results = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ATTATTR_TENSOR_CORES", flag)
        emulated.library.emu_mma_instructions()
        maps, head_sum, head_max = emulated.attr_from_grad(q, k, v, g32, pad, None, d**-0.5, True, True, 0)
        count = emulated.library.emu_mma_instructions()
        assert (count > 0) == (flag == "1"), (flag, count)
        scale = truth["maps"].abs().max().item()
        for name, got in (("maps", maps), ("head_sum", head_sum), ("head_max", head_max)):
            torch.testing.assert_close(got.double(), truth[name], atol=2e-5 * scale, rtol=2e-5, msg=f"{flag} {name}")
        results[flag] = maps
    torch.testing.assert_close(results["1"], results["0"], atol=2e-5 * scale, rtol=2e-5)
    # the wrapper hands the bfloat16 / float32 mix to the kernel unchanged
    monkeypatch.setenv("ATTATTR_TENSOR_CORES", "1")
    emulated.library.emu_mma_instructions()
    got = emulated_wrappers.attribution_from_grad(q, k, v, g32, pad, causal=True)
    assert emulated.library.emu_mma_instructions() > 0
    torch.testing.assert_close(got["maps"], results["1"], atol=0, rtol=0)
    # float16 q, k, v with a float32 G are not split: an error from the binding
    with pytest.raises(RuntimeError, match="has dtype"):
        emulated.attr_from_grad(q.half(), k.half(), v.half(), g32, pad, None, d**-0.5, True, False, 0)

# (batch, heads, n_q, n_k, d_head, dtype, masked, causal)
PV_CASES = [
    (2, 2, 70, 70, 80, torch.bfloat16, True, False),  # partial tiles, d padded to 96
    (1, 2, 33, 129, 32, torch.float16, False, True),  # three key tiles, causal (bottom right)
    (3, 1, 65, 65, 128, torch.bfloat16, True, True),  # a fully padded item, 8 tiles of 8 columns
    (1, 2, 70, 5, 64, torch.float16, True, True),  # n_q > n_k, causal: rows with no allowed key give 0
]


@pytest.mark.slow
@pytest.mark.parametrize("case", PV_CASES, ids=lambda c: "x".join(map(str, c[:5])) + "-" + str(c[5]).split(".")[-1])
def test_emulated_forward_pv_on_tensor_cores(emulated, case, monkeypatch):
    """attn_forward's P V on tensor cores (issue 53): O within half an ulp of the output dtype
    (plus a floor far below one) of the float64 truth, as close as the fp32 path; and the
    emulated mma count is exactly that of Q K^T and P V (P split into two parts) on every
    (query tile, key tile), so P V does not run on the CUDA cores."""
    b, h, n_q, n_k, d, dtype, masked, causal = case
    emulated.library.emu_mma_instructions.restype = ctypes.c_ulonglong
    q, k, v, _ = _inputs(b, h, n_q, n_k, d, dtype, seed=n_q + 3 * d)
    pad = _padding(b, n_k) if masked else None
    truth = _truth(q, k, v, v[..., :1, :].expand(b, h, n_q, d), pad, causal)["o"]
    half_ulp = 2.0 ** -(8 if dtype == torch.bfloat16 else 11)
    floor = 1e-4 * truth.abs().max().item()
    outs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ATTATTR_TENSOR_CORES", flag)
        emulated.library.emu_mma_instructions()
        o, _stats = emulated.attn_forward(q, k, v, pad, d**-0.5, causal, 0)
        count = emulated.library.emu_mma_instructions()
        err = (o.double() - truth).abs()
        bound = half_ulp * truth.abs() + floor
        assert (err <= bound).all(), f"tensor_cores={flag}: worst excess {(err - bound).max().item():.3g}"
        outs[flag] = o
        if flag == "0":
            assert count == 0
            continue
        dp = -(-d // 32) * 32  # the padded head dim the dispatcher picks (32, 64, 96, 128)
        q_tiles, k_tiles = -(-n_q // 64), -(-n_k // 64)
        if causal:  # key tiles up to the causal end of each query tile
            k_tiles_per = [-(-min(n_k, max(0, min(q0 + 64, n_q) - 1 + n_k - n_q + 1)) // 64) for q0 in range(0, n_q, 64)]
        else:
            k_tiles_per = [k_tiles] * q_tiles
        per_tile = 8 * ((dp // 16) * 4 + (64 // 16) * (dp // 16) * 2)  # 8 warps: Q K^T, then P V (hi + lo)
        assert count == b * h * sum(k_tiles_per) * per_tile, (count, k_tiles_per)
    # the two paths: each within half an ulp of the truth, so at most one ulp apart
    diff = (outs["1"].double() - outs["0"].double()).abs()
    assert (diff <= 2 * half_ulp * truth.abs() + 2 * floor).all()


# (batch, heads, n_q, n_k, d_head, dtype, g dtype, masked, causal, read_from)
KEY_SUM_CASES = [
    (3, 2, 70, 70, 64, torch.float32, torch.float32, True, False, 40),
    (2, 5, 40, 40, 32, torch.float32, torch.float32, False, True, 0),  # 3 head groups (4 SMs)
    (1, 2, 33, 129, 32, torch.bfloat16, torch.bfloat16, False, True, 20),  # tensor cores, n_q < n_k
    (2, 3, 70, 70, 64, torch.bfloat16, torch.float32, True, True, 69),  # split G (the engine's bf16)
    (1, 2, 130, 70, 48, torch.float16, torch.float16, True, False, 200),  # read_from past n_q: zeros
]


@pytest.mark.slow
@pytest.mark.parametrize("case", KEY_SUM_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-{c[-1]}")
def test_emulated_key_sums_match_reference(emulated, emulated_wrappers, case):
    """The per-key-sum epilogue (the sources' quantity, no n_q x n_k array): per key j the
    attribution summed over heads and query rows, and over the rows i >= read_from, against
    the float64 truth; head_max bit for bit that of attr_from_grad; run to run identical;
    the launches: the attribution grid, the per-key reduction and the head-max reduction."""
    b, h, n_q, n_k, d, dtype, gdtype, masked, causal, read_from = case
    q, k, v, g = _inputs(b, h, n_q, n_k, d, dtype, seed=n_q + n_k + d)
    g = g.to(gdtype)
    pad = _padding(b, n_k) if masked else None
    truth = _truth(q, k, v, g, pad, causal)
    scale = d**-0.5
    _, _, head_max_full = emulated.attr_from_grad(q, k, v, g, pad, None, scale, causal, False, 0)
    _o, stats = emulated.attn_forward(q, k, v, pad, scale, causal, 0)
    _launch_grids(emulated)
    key_sums, head_max = emulated.attr_key_sums(q, k, v, g, pad, stats, scale, causal, read_from, 0)
    grids = _launch_grids(emulated)
    plan = kernel.attribution_grid(b, h, n_q, n_k, sms=4)
    assert grids[0] == (-(-n_k // 64), -(-n_q // 64), b * plan["groups"]) and len(grids) == 3, grids
    assert key_sums.shape == (b, 2, n_k) and key_sums.dtype == torch.float32
    want_all = truth["maps"].sum((1, 2))
    want_read = truth["maps"][:, :, read_from:].sum((1, 2))
    mag = truth["maps"].abs().sum((1, 2)).max().item()  # the sums' own scale
    torch.testing.assert_close(key_sums[:, 0].double(), want_all, atol=2e-6 * mag, rtol=1e-5)
    torch.testing.assert_close(key_sums[:, 1].double(), want_read, atol=2e-6 * mag, rtol=1e-5)
    assert torch.equal(head_max, head_max_full)
    again, _ = emulated.attr_key_sums(q, k, v, g, pad, None, scale, causal, read_from, 0)
    assert torch.equal(again, key_sums)  # deterministic, with the statistics recomputed too
    # the wrapper and both backends give the same dict
    got = emulated_wrappers.attribution_key_sums(q, k, v, g, pad, causal=causal, read_from=read_from)
    assert set(got) == {"key_sum", "read_sum", "total", "head_max"}
    assert torch.equal(got["key_sum"], key_sums[:, 0]) and torch.equal(got["read_sum"], key_sums[:, 1])
    ref = TorchBackend().attribution_key_sums(q, k, v, g, pad, causal=causal, read_from=read_from)
    for name in ("key_sum", "read_sum", "head_max"):
        torch.testing.assert_close(ref[name].double(), got[name].double(), atol=2e-5 * mag, rtol=2e-5, msg=name)
    torch.testing.assert_close(got["total"], truth["maps"].sum((1, 2, 3)), atol=2e-6 * mag * n_k, rtol=1e-5)
    assert "read_sum" not in emulated_wrappers.attribution_key_sums(q, k, v, g, pad, causal=causal)


@pytest.mark.slow
def test_emulated_plan_matches_python_mirror(emulated):
    for b, h, n, sms in itertools.product((1, 3, 40000), (1, 2, 12, 16), (1, 64, 65, 128, 512, 4096), (1, 108, 132)):
        want = kernel.attribution_grid(b, h, n, n, sms)
        per_group, workspace, partials = _plan(emulated, b, h, n, n, sms)
        assert (per_group, workspace) == (want["heads_per_group"], want["workspace_floats"]), (b, h, n, sms)
        assert partials == b * h * (-(-n // 64)) ** 2


@pytest.mark.slow
def test_emulated_bert_base_grid_fills_132_sms(emulated, monkeypatch):
    """A 128-token BERT-base example: 48 attribution blocks on 132 SMs, still exact."""
    monkeypatch.setenv("ATTATTR_EMU_SMS", "132")
    b, h, n, d = 1, 12, 128, 64
    q, k, v, g = _inputs(b, h, n, n, d, torch.float32, seed=21)
    pad = torch.zeros(b, n)
    pad[0, 100:] = NEG
    o, stats = emulated.attn_forward(q, k, v, pad, d**-0.5, False, 0)
    _launch_grids(emulated)
    maps, head_sum, head_max = emulated.attr_from_grad(q, k, v, g, pad, stats, d**-0.5, False, True, 0)
    grids = _launch_grids(emulated)
    attr_grid = grids[0]
    assert attr_grid == (2, 2, 12) and attr_grid[0] * attr_grid[1] * attr_grid[2] >= 48
    truth = _truth(q, k, v, g, pad, False)
    for name, got in (("maps", maps), ("head_sum", head_sum), ("head_max", head_max)):
        torch.testing.assert_close(got.double(), truth[name], atol=2e-5, rtol=2e-5, msg=name)
    # one SM: one group (no workspace), the same numbers
    monkeypatch.setenv("ATTATTR_EMU_SMS", "1")
    _, head_sum1, head_max1 = emulated.attr_from_grad(q, k, v, g, pad, stats, d**-0.5, False, False, 0)
    assert _launch_grids(emulated)[0] == (2, 2, 1)
    torch.testing.assert_close(head_sum1, head_sum, atol=1e-6, rtol=1e-6)
    assert torch.equal(head_max1, head_max)


@pytest.mark.slow
def test_emulated_wrappers_and_backend(emulated_wrappers):
    kern = emulated_wrappers
    q, k, v, g = _inputs(3, 2, 33, 33, 64, torch.float16, seed=5)
    pad = _padding(3, 33)
    assert kern.supports(q, pad) and kern.supports(q, pad[:, None, None, :])
    assert not kern.supports(q, torch.zeros(3, 1, 33, 33))
    got = kern.attribution_from_grad(q, k, v, g, pad[:, None, None, :], causal=True)
    truth = _truth(q, k, v, g, pad, True)
    assert set(got) == {"maps", "head_sum", "head_max"}
    for name in got:
        torch.testing.assert_close(got[name].double(), truth[name], atol=2e-5, rtol=2e-5)
    no_maps = kern.attribution_from_grad(q, k, v, g, pad, want_maps=False, causal=True)
    assert set(no_maps) == {"head_sum", "head_max"}
    # half q, k, v with a float32 G (the engine's bf16 path): q, k, v are upcast, G kept
    g32 = g.float() + 1e-3 * torch.randn(g.shape, generator=torch.Generator().manual_seed(9))
    mixed = kern.attribution_from_grad(q, k, v, g32, pad, causal=True)
    truth32 = _truth(q, k, v, g32, pad, True)
    for name in mixed:
        torch.testing.assert_close(mixed[name].double(), truth32[name], atol=2e-5, rtol=2e-5)
    o, lse = kern.attention_forward_with_lse(q, k, v, pad, causal=True)
    torch.testing.assert_close(o.double(), truth["o"], atol=4e-3, rtol=1e-3)
    scores = (q.double() @ k.double().transpose(-1, -2)) * 64**-0.5 + _causal_truth_mask(pad, 33, 33, 3)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), atol=1e-4, rtol=1e-5)
    # the backend: kernel path for supported inputs, reference for a general mask
    backend = CudaBackend()
    via_backend = backend.attribution_from_grad(q, k, v, g, pad, causal=True)
    torch.testing.assert_close(via_backend["head_sum"], got["head_sum"])
    general = torch.zeros(3, 1, 33, 33)
    via_reference = backend.attribution_from_grad(q.float(), k.float(), v.float(), g.float(), general)
    want = reference.attribution_from_grad(q.float(), k.float(), v.float(), g.float(), general)
    torch.testing.assert_close(via_reference["maps"], want["maps"])


@pytest.mark.slow
def test_emulated_ops_opcheck_and_compile(emulated_wrappers, emulated):
    q, k, v, g = _inputs(2, 2, 20, 20, 32, torch.float32, seed=7, strided=False)
    pad = _padding(2, 20)
    scale = 32**-0.5
    torch.library.opcheck(emulated.attn_forward.default, (q, k, v, pad, scale, True, 0))
    torch.library.opcheck(emulated.attr_from_grad.default, (q, k, v, g, pad, None, scale, False, True, 0))
    torch.library.opcheck(emulated.attr_from_grad.default, (q, k, v, g, None, None, scale, True, False, 0))
    torch.library.opcheck(emulated.attr_key_sums.default, (q, k, v, g, pad, None, scale, True, 7, 0))

    def fn(q, k, v, g, pad):
        o = kernel.attention_forward(q, k, v, pad, causal=True)
        attr = kernel.attribution_from_grad(q, k, v, g, pad, want_maps=False, causal=True)
        keys = kernel.attribution_key_sums(q, k, v, g, pad, causal=True, read_from=7)
        return o, attr["head_sum"], attr["head_max"], keys["key_sum"], keys["read_sum"]

    eager = fn(q, k, v, g, pad)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(q, k, v, g, pad)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)



# ------------------------------------------------------------------ launches and CUDA graphs
def _tiny_pass():
    """An integration-pass-like function: a forward and a backward through a small MLP."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))

    def fn(x, w):
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            f = net(x).logsumexp(-1)
            (g,) = torch.autograd.grad((f * w).sum(), x)
        return g, f.detach()

    return net, fn


def test_op_counter_counts_forward_and_backward_ops():
    """The dispatch-level counter sees the backward's ops too, sorts views out of the ops that
    launch kernels, counts per region, and its count does not depend on the tensors' sizes
    (the launches of a pass depend on the graph of ops, not on the widths)."""
    from attattr_cli.ops.graphs import OpCounter

    _net, fn = _tiny_pass()
    counts = []
    for batch in (2, 40):
        x, w = torch.randn(batch, 8), torch.rand(batch)
        with OpCounter() as counter:
            with counter.region("pass"):
                fn(x, w)
            (x * 2).view(-1)
        counts.append(counter)
        assert counter.regions["pass"].launching > 0 and counter.entries["pass"] == 1
        assert counter.all.launching == counter.regions["pass"].launching + 1  # the mul; the view launches nothing
        assert counter.all.total > counter.all.launching
        assert counter.regions["pass"].by_op["aten::addmm"] == 2  # the two Linear layers' forwards
        assert any("backward" in name or name == "aten::mm" for name in counter.regions["pass"].by_op)
    assert counts[0].all.launching == counts[1].all.launching


def test_captured_pass_falls_back_to_eager_on_cpu(monkeypatch):
    """ATTATTR_CUDA_GRAPHS=1 on CPU tensors: the pass runs eagerly, with the same results as
    the plain call, and the reason is recorded; off, nothing is recorded."""
    from attattr_cli.ops import graphs

    _net, fn = _tiny_pass()
    x, w = torch.randn(5, 8), torch.rand(5)
    want = fn(x, w)
    monkeypatch.setenv(graphs.ENV_VAR, "1")
    captured = graphs.CapturedPass()
    for _ in range(3):
        got = captured.run("layer-0", fn, x, w)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    assert captured.stats()["captures"] == 0 and captured.eager_calls == 3
    assert captured.stats()["fallbacks"] == ["inputs not on a CUDA device"]
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    off = graphs.CapturedPass()
    assert not off.enabled
    off.run("layer-0", fn, x, w)
    assert off.fallback_reasons == {} and off.eager_calls == 1
    with_aux = graphs.CapturedPass(enabled=True, aux=True)
    tensors, aux = with_aux.run("k", lambda x, w: (fn(x, w), {"saved": 1}), x, w)
    assert aux == {"saved": 1} and torch.equal(tensors[0], want[0])


def test_emulated_graph_replays_new_inputs_and_bakes_in_what_it_read(monkeypatch):
    """ATTATTR_CUDA_GRAPHS=emulate on the CPU: a pass (forward and backward) is captured once
    and replayed; the replay of new inputs equals the eager call bit for bit, and like a CUDA
    graph it reads the tensors it read at capture: a closure's tensor swapped for another is
    not seen (the same tensor changed in place is), and an op that waits for the device
    refuses the capture (the pass then runs eagerly, with the reason)."""
    from attattr_cli.ops import graphs

    net, fn = _tiny_pass()
    monkeypatch.setenv(graphs.ENV_VAR, "emulate")
    captured = graphs.CapturedPass(warmup=1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        x, w = torch.randn(6, 8, generator=gen), torch.rand(6, generator=gen)
        got, want = captured.run("pass", fn, x, w), fn(x, w)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    assert (captured.captures, captured.replays, captured.eager_calls) == (1, 4, 0), captured.stats()

    held = {"bias": torch.ones(3)}
    stale = graphs.CapturedPass(enabled=True, emulate=True, warmup=0)
    add = lambda x: x + held["bias"]  # noqa: E731
    x = torch.zeros(3)
    assert torch.equal(stale.run("k", add, x)[0], torch.ones(3))
    held["bias"] = torch.full((3,), 5.0)  # another tensor: the graph still reads the first
    assert torch.equal(stale.run("k", add, x)[0], torch.ones(3))
    first = held["bias"] = torch.ones(3)
    fresh = graphs.CapturedPass(enabled=True, emulate=True, warmup=0)
    fresh.run("k", add, x)
    first.fill_(7.0)  # the same tensor changed in place: read by the replay
    assert torch.equal(fresh.run("k", add, x)[0], torch.full((3,), 7.0))

    syncing = graphs.CapturedPass(enabled=True, emulate=True, warmup=0)
    (out,) = syncing.run("k", lambda x: x * float(x.sum()), torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0)) and syncing.captures == 0
    assert "waits for the device" in syncing.stats()["fallbacks"][0]


def test_captured_pass_stops_trying_after_failed_captures():
    """A pass that waits for the device fails every capture: after GIVE_UP failures no other key
    is tried (each try costs the warm-up runs), and the reason says so."""
    from attattr_cli.ops import graphs

    captured = graphs.CapturedPass(enabled=True, emulate=True, warmup=1)
    calls = []

    def syncing(x):
        calls.append(1)
        return x * float(x.sum())

    for size in range(2, 7):
        captured.run("k", syncing, torch.ones(size))
    tried = graphs.GIVE_UP * 2  # a warm-up and the failed recording per try
    assert len(calls) == tried + 5 and captured.captures == 0 and captured.eager_calls == 5
    assert any("no more captures tried" in r for r in captured.stats()["fallbacks"])


def test_captured_pass_lets_the_least_recent_graph_go():
    """Past max_graphs the least recently replayed graph is dropped (not every later pass eager)."""
    from attattr_cli.ops import graphs

    captured = graphs.CapturedPass(enabled=True, emulate=True, warmup=0, max_graphs=2)
    x = torch.ones(2)
    for key in ("a", "b", "a", "c"):
        captured.run(key, lambda t: t * 2, x)
    assert [k[0] for k in captured.graphs] == ["a", "c"] and captured.eager_calls == 0


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_gpu_captured_pass_replays_and_matches_eager():
    """On a GPU the pass (forward and backward) is captured once and replayed: the replay's
    results equal the eager ones for new inputs each time (not the captured inputs')."""
    from attattr_cli.ops import graphs

    net, fn = _tiny_pass()
    net.cuda()
    captured = graphs.CapturedPass(enabled=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(4):
        x = torch.randn(6, 8, device="cuda", generator=gen)
        w = torch.rand(6, device="cuda", generator=gen)
        got = captured.run("pass", fn, x, w)
        want = fn(x, w)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert captured.captures == 1 and captured.replays == 4, captured.stats()
    assert not captured.fallback_reasons


# ------------------------------------------------------------------ GPU benchmark scripts
def test_gpu_all_script_parses():
    """bench/gpu_all.sh (run on a GPU machine only) is valid bash."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not found")
    proc = subprocess.run([bash, "-n", str(ROOT / "bench" / "gpu_all.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_bench_kernel_smoke_writes_table_and_json(tmp_path):
    """bench/bench_kernel.py's table and JSON code, on the CPU (no kernel, tiny n)."""
    import json

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_kernel
    finally:
        sys.path.remove(str(ROOT / "bench"))
    out = tmp_path / "k.json"
    assert bench_kernel.main(["--smoke", "--ns", "16", "--dtypes", "bf16", "fp32", "--min-time", "0.001",
                              "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [(r["dtype"], r["n"]) for r in payload["rows"]] == [("bf16", 16), ("fp32", 16)]
    bf16 = payload["rows"][0]
    assert bf16["ref_ms"] > 0 and bf16["sdpa_bwd_ms"] > 0 and bf16["attr_flops"] == 4 * 12 * 16 * 16 * 64
    assert "sdpa bwd" in payload["table"] and "TFLOP/s" in payload["table"]


def _bench_module(name):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_bench_kernel_counts_ops_of_a_scored_example_on_cpu():
    """--count-ops without a GPU: the aten ops one scored example runs (BERT-base's graph,
    narrowed), the same count at two widths, the integration passes found and what one graph
    replay per pass would leave."""
    rows = _bench_module("bench_kernel").count_ops([32], steps=2)
    (row,) = rows
    assert row["launching_ops"] > 0 and row["ops"] > row["launching_ops"]
    assert len(set(row["launching_ops_at_head_dims"].values())) == 1, row["launching_ops_at_head_dims"]
    assert row["passes"] >= 1 and 0 < row["pass_launching_ops"] < row["launching_ops"]
    assert row["launches_with_graphs"] == row["launching_ops"] - row["pass_launching_ops"] + row["passes"]


def test_bench_long_sources_smoke(capsys):
    """bench/bench_long_sources.py's child on the CPU, in this process (tiny model, 96 tokens):
    keep sources gives per layer a key sum, and the op alone agrees between the per-key sums
    and the head sum. (The parent only runs children and writes their JSON lines.)"""
    import json

    assert _bench_module("bench_long_sources").main(["--smoke", "--child"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["status"] == "ok", row
    assert row["key_sum_shape"] == [2, 96]  # [layer, key]
    assert row["op"]["max_abs_diff_vs_head_sum"] < 1e-6


# ------------------------------------------------------------------ GPU tests
@pytest.fixture(scope="module")
def cuda_kernel():
    """The built kernels (without a CUDA device conftest skips every ``gpu`` test before this runs)."""
    if not HAS_CUDA:
        pytest.skip("needs a CUDA device")
    if not kernel.available():
        pytest.fail(f"the CUDA kernels are unavailable on a CUDA machine: {kernel.unavailable_reason()}")
    return kernel


def _max_err(got: torch.Tensor, truth: torch.Tensor) -> float:
    return (got.double() - truth).abs().max().item() if truth.numel() else 0.0


def _check_precision(name, got, plain, truth, dtype):
    """fp32: tight; half types: at most 2x plain PyTorch's error (plus a tiny floor)."""
    err = _max_err(got, truth)
    err_plain = _max_err(plain, truth)
    magnitude = truth.abs().max().item() if truth.numel() else 0.0
    floor = 2e-5 * max(1.0, magnitude)
    if dtype == torch.float32:
        assert err <= max(2 * err_plain, floor), f"{name}: kernel err {err:.3g}, torch err {err_plain:.3g}"
    else:
        assert err <= 2 * err_plain + floor, f"{name}: kernel err {err:.3g}, torch err {err_plain:.3g}"


GPU_NS = [1, 7, 64, 128, 257, 512, 2048]
GPU_DS = [32, 64, 80, 128]
GPU_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda t: str(t).split(".")[-1])
@pytest.mark.parametrize("d", GPU_DS)
@pytest.mark.parametrize("n", GPU_NS)
def test_gpu_kernel_matches_reference(cuda_kernel, n, d, dtype, masked, causal):
    b, h = 3, 2
    q, k, v, g = (t.cuda() for t in _inputs(b, h, n, n, d, dtype, seed=n * 131 + d))
    pad = _padding(b, n, device="cuda") if masked else None
    truth = _truth(q, k, v, g, pad, causal)
    plain = TorchBackend().attribution_from_grad(q, k, v, g, pad, causal=causal)
    plain_o = TorchBackend().attention_forward(q, k, v, pad, causal=causal)
    if causal:  # no row is empty when n_q == n_k, but keep NaN out of the comparison anyway
        plain = {key: val.nan_to_num(0.0) for key, val in plain.items()}
    got = cuda_kernel.attribution_from_grad(q, k, v, g, pad, causal=causal)
    assert got["maps"].dtype == torch.float32 and got["maps"].shape == (b, h, n, n)
    for name in ("maps", "head_sum", "head_max"):
        _check_precision(name, got[name], plain[name], truth[name], dtype)
    lean = cuda_kernel.attribution_from_grad(q, k, v, g, pad, want_maps=False, causal=causal)
    assert "maps" not in lean
    torch.testing.assert_close(lean["head_sum"], got["head_sum"], rtol=0, atol=0)
    torch.testing.assert_close(lean["head_max"], got["head_max"], rtol=0, atol=0)
    o, stats = cuda_kernel.attention_forward_with_stats(q, k, v, pad, causal=causal)
    assert o.dtype == dtype
    _check_precision("o", o, plain_o, truth["o"], dtype)
    reused = cuda_kernel.attribution_from_grad(q, k, v, g, pad, want_maps=False, causal=causal, stats=stats)
    torch.testing.assert_close(reused["head_sum"], got["head_sum"], rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("n", [128, 512])
def test_gpu_head_groups_deterministic(cuda_kernel, n):
    """BERT-base shapes, where the heads are split into groups: bit-for-bit repeatable and
    equal (to float32 rounding of the group sums) to the float64 truth."""
    q, k, v, g = (t.cuda() for t in _inputs(1, 12, n, n, 64, torch.bfloat16, seed=n))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = kernel.attribution_grid(1, 12, n, n, sms)
    first = cuda_kernel.attribution_from_grad(q, k, v, g)
    again = cuda_kernel.attribution_from_grad(q, k, v, g)
    for name in first:
        assert torch.equal(first[name], again[name]), name
    truth = _truth(q, k, v, g, None, False)
    for name in first:
        torch.testing.assert_close(first[name].double(), truth[name], atol=2e-5, rtol=2e-5)
    if n == 128:
        assert plan["blocks"] >= 48



@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_gpu_tensor_core_path_agrees_with_the_fp32_path(cuda_kernel, dtype, monkeypatch):
    """Half inputs on tensor cores (the default) and on the CUDA-core path
    (ATTATTR_TENSOR_CORES=0): both within the fp32 tolerance of the float64 truth, so they
    agree with each other to float rounding."""
    q, k, v, g = (t.cuda() for t in _inputs(2, 3, 300, 300, 64, dtype, seed=53))
    pad = _padding(2, 300, device="cuda", full_row=False)
    truth = _truth(q, k, v, g, pad, True)
    got = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("ATTATTR_TENSOR_CORES", flag)
        got[flag] = cuda_kernel.attribution_from_grad(q, k, v, g, pad, causal=True)
        o = cuda_kernel.attention_forward(q, k, v, pad, causal=True)
        torch.testing.assert_close(o.double(), truth["o"], atol=2e-2, rtol=1e-2)
        for name in ("maps", "head_sum", "head_max"):
            torch.testing.assert_close(got[flag][name].double(), truth[name], atol=3e-5, rtol=3e-5, msg=name)
    for name in ("maps", "head_sum", "head_max"):
        torch.testing.assert_close(got["1"][name], got["0"][name], atol=3e-5, rtol=3e-5)

@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_gpu_forward_pv_on_tensor_cores_within_half_an_ulp(cuda_kernel, dtype, monkeypatch):
    """The forward's P V on tensor cores (P in two half parts): O within half an ulp of the
    output dtype of the float64 truth (plus 1e-4 of its largest entry), on both paths."""
    q, k, v, _ = (t.cuda() for t in _inputs(2, 3, 700, 700, 64, dtype, seed=54))
    pad = _padding(2, 700, device="cuda", full_row=False)
    truth = _truth(q, k, v, q, pad, True)["o"]
    half_ulp = 2.0 ** -(8 if dtype == torch.bfloat16 else 11)
    for flag in ("1", "0"):
        monkeypatch.setenv("ATTATTR_TENSOR_CORES", flag)
        o = cuda_kernel.attention_forward(q, k, v, pad, causal=True)
        excess = (o.double() - truth).abs() - (half_ulp * truth.abs() + 1e-4 * truth.abs().max())
        assert excess.max().item() <= 0, (flag, excess.max().item())


@gpu
@pytest.mark.parametrize("n", [130, 2048])
def test_gpu_key_sums_match_the_head_sum(cuda_kernel, n):
    """attr_key_sums on a GPU (bfloat16 q, k, v with a float32 G, causal, a padding mask):
    the per-key sums of the head sum, over all rows and over the rows from read_from on, run to
    run identical, and the head maxima those of attribution_from_grad."""
    q, k, v, _ = (t.cuda() for t in _inputs(2, 12, n, n, 64, torch.bfloat16, seed=55))
    g = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(56)) * 1e-3
    pad = _padding(2, n, device="cuda", full_row=False)
    full = cuda_kernel.attribution_from_grad(q, k, v, g, pad, causal=True, want_maps=False)
    got = cuda_kernel.attribution_key_sums(q, k, v, g, pad, causal=True, read_from=n // 3)
    mag = full["head_sum"].abs().sum(1).max().item()
    torch.testing.assert_close(got["key_sum"], full["head_sum"].sum(1), atol=1e-6 * mag, rtol=1e-5)
    torch.testing.assert_close(got["read_sum"], full["head_sum"][:, n // 3:].sum(1), atol=1e-6 * mag, rtol=1e-5)
    assert torch.equal(got["head_max"], full["head_max"])
    again = cuda_kernel.attribution_key_sums(q, k, v, g, pad, causal=True, read_from=n // 3)
    assert torch.equal(again["key_sum"], got["key_sum"]) and torch.equal(again["read_sum"], got["read_sum"])


@gpu
def test_gpu_backend_selection(cuda_kernel, monkeypatch):
    monkeypatch.delenv("ATTATTR_KERNEL", raising=False)
    assert select_backend("auto", device="cuda").name == "cuda"
    monkeypatch.setenv("ATTATTR_KERNEL", "torch")
    assert select_backend("auto", device="cuda").name == "torch"


@gpu
def test_gpu_noncausal_unequal_lengths_and_causal_empty_rows(cuda_kernel):
    for n_q, n_k in ((5, 300), (300, 5)):
        q, k, v, g = (t.cuda() for t in _inputs(2, 3, n_q, n_k, 64, torch.float32, seed=n_q))
        pad = _padding(2, n_k, device="cuda")
        for causal in (False, True):
            truth = _truth(q, k, v, g, pad, causal)
            got = cuda_kernel.attribution_from_grad(q, k, v, g, pad, causal=causal)
            for name in ("maps", "head_sum", "head_max"):
                torch.testing.assert_close(got[name].double(), truth[name], atol=3e-5, rtol=3e-5)
            o = cuda_kernel.attention_forward(q, k, v, pad, causal=causal)
            torch.testing.assert_close(o.double(), truth["o"], atol=3e-5, rtol=3e-5)


@gpu
def test_gpu_opcheck(cuda_kernel):
    q, k, v, g = (t.cuda() for t in _inputs(2, 2, 70, 70, 64, torch.bfloat16, seed=3))
    pad = _padding(2, 70, device="cuda")
    torch.library.opcheck(torch.ops.attattr.attn_forward.default, (q, k, v, pad, 0.125, True, -1))
    torch.library.opcheck(
        torch.ops.attattr.attr_from_grad.default, (q, k, v, g, pad, None, 0.125, False, True, -1)
    )


@gpu
def test_gpu_torch_compile(cuda_kernel):
    q, k, v, g = (t.cuda() for t in _inputs(2, 4, 200, 200, 64, torch.bfloat16, seed=11))
    pad = _padding(2, 200, device="cuda")

    def fn(q, k, v, g, pad):
        o = kernel.attention_forward(q, k, v, pad)
        attr = kernel.attribution_from_grad(q, k, v, g, pad, want_maps=True)
        return o.float().sum(-1), attr["maps"], attr["head_sum"] * 2, attr["head_max"]

    eager = fn(q, k, v, g, pad)
    compiled = torch.compile(fn, fullgraph=True)(q, k, v, g, pad)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)


@gpu
@pytest.mark.slow
def test_gpu_long_sequence_without_maps(cuda_kernel):
    n = 8192
    q, k, v, g = (t.cuda() for t in _inputs(1, 2, n, n, 64, torch.bfloat16, seed=13, strided=False))
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    got = cuda_kernel.attribution_from_grad(q, k, v, g, want_maps=False, causal=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    # the head sum (n*n fp32) plus small change; no [H, n, n] intermediate
    assert peak <= n * n * 4 * 1.1 + (64 << 20)
    # spot-check a few rows against the float64 truth
    rows = torch.tensor([0, 1, 4095, 8191], device="cuda")
    qs, gs = q[:, :, rows], g[:, :, rows]
    s = (qs.double() @ k.double().transpose(-1, -2)) * 64**-0.5
    allowed = torch.arange(n, device="cuda")[None, :] <= rows[:, None]
    s = s.masked_fill(~allowed, float("-inf"))
    maps = torch.softmax(s, -1) * (gs.double() @ v.double().transpose(-1, -2))
    torch.testing.assert_close(got["head_sum"][:, rows].double(), maps.sum(1), atol=1e-4, rtol=1e-4)


@gpu
def test_gpu_results_copied_through_page_locked_memory():
    from attattr_cli.engine.memory import to_host

    t = torch.randn(3, 40, 50, device="cuda").transpose(1, 2)  # not contiguous
    host = to_host(t)
    assert host.device.type == "cpu" and host.is_pinned()
    assert torch.equal(host, t.cpu())


def _small_bert(tmp_path):
    """A 3-layer, 2-head BERT classifier (random init, seed 0) and its 55-word tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(50)]))
    tok = BertTokenizerFast(str(vocab), model_max_length=512)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=55, hidden_size=128, num_hidden_layers=3, num_attention_heads=2,
                     intermediate_size=200, max_position_embeddings=512, num_labels=3)
    return BertForSequenceClassification(cfg).eval(), tok


@gpu
@pytest.mark.parametrize("kind", ["torch", "cuda"])
def test_gpu_scoring_agrees_with_cpu(cuda_kernel, kind, tmp_path):
    """The whole scoring path on the GPU (sweeps past 256 tokens there, the kernel or the
    reference, the results copied through page-locked memory) against the CPU path (one pass
    per layer past 256 tokens): maps, attention and F, float32."""
    from attattr_cli.data.types import Example
    from attattr_cli.engine import sweep
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer
    from attattr_cli.models.loading import prepare

    model, tok = _small_bert(tmp_path)
    for n in (40, 300):
        assert sweep.MAX_TOKENS < 300 <= sweep.CUDA_MAX_TOKENS
        example = Example(0, " ".join(f"w{i % 50}" for i in range(n - 2)))
        ref = Scorer(prepare(model, tok, "cpu"), ScoreOptions(steps=8, keep="maps", kernel="torch")).score(example)
        got = Scorer(prepare(model.cuda(), tok, "gpu"), ScoreOptions(steps=8, keep="maps", kernel=kind)).score(example)
        model.cpu()
        scale = abs(ref.attribution).max()
        assert abs(got.attribution - ref.attribution).max() <= 1e-4 * scale, n
        assert abs(got.attention - ref.attention).max() <= 1e-5, n
        assert abs(got.f_full - ref.f_full) <= 1e-5 and not got.nonfinite


@gpu
@pytest.mark.parametrize("swept", [True, False], ids=["sweeps", "per-layer"])
def test_gpu_cuda_graphs_replay_later_examples_with_the_eager_numbers(cuda_kernel, swept, tmp_path, monkeypatch):
    """ATTATTR_CUDA_GRAPHS=1 on a GPU: the first example of a length captures its passes, the
    later ones replay them (their ids and clean forward copied into the static slots), and every
    map, residual and estimate equals the eager scoring's to float rounding."""
    import numpy as np

    from attattr_cli.data.types import Example
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer
    from attattr_cli.models.loading import prepare
    from attattr_cli.ops import graphs

    model, tok = _small_bert(tmp_path)
    model.cuda()
    examples = [Example(i, " ".join(f"w{(7 * i + j) % 50}" for j in range(38))) for i in range(4)]
    for options in (dict(steps=8), dict(tol=0.01)):
        results = {}
        for mode in ("0", "1"):
            monkeypatch.setenv(graphs.ENV_VAR, mode)
            scorer = Scorer(prepare(model, tok, "gpu"), ScoreOptions(keep="maps", kernel="cuda", **options))
            scorer.sweep = swept
            results[mode] = [scorer.score(e) for e in examples]
        shared = scorer.__dict__["_graphs"]
        assert not shared.fallback_reasons and shared.replays > shared.captures > 0, shared.stats()
        for eager, replayed in zip(results["0"], results["1"]):
            scale = abs(eager.attribution).max()
            assert abs(replayed.attribution - eager.attribution).max() <= 1e-5 * scale
            assert abs(replayed.residual - eager.residual).max() <= 1e-5 * max(abs(eager.f_full), 1)
            assert np.array_equal(replayed.families["self"].nodes, eager.families["self"].nodes)


@gpu
def test_keep_sources_on_the_kernel_is_the_reference_per_key(tokenizer):
    """keep sources on the CUDA kernel takes its per-key sums from the kernel's epilogue
    (engine/assembly.py, no n x n head sum): the sources, key sums, read sums and residuals
    agree with the reference path's on the CPU."""
    from attattr_cli.data.types import Example
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer
    from attattr_cli.models.loading import prepare
    from conftest import build_model

    text = "w1 w2 w3\n\nw4 w5 w6 w7\n\nw8 w9 w10 w11\n\nw14 w15"
    model = build_model("llama", torch.float32, num_labels=2, layers=2, lm=True)
    opts = dict(lm=True, continuation="w12 w13", keep="sources", sources="paragraphs", steps=8)
    ref = Scorer(prepare(model, tokenizer, "cpu", lm=True), ScoreOptions(kernel="torch", **opts)).score(Example(0, text))
    got = Scorer(prepare(model.cuda(), tokenizer, "gpu", lm=True), ScoreOptions(kernel="cuda", **opts)).score(Example(0, text))
    model.cpu()
    for name in ("key_sum", "read_sum"):
        a, b = (getattr(next(iter(r.families.values())), name) for r in (ref, got))
        assert (a is None) == (b is None), name
        if a is not None:
            assert abs(b - a).max() <= 1e-4 * max(abs(a).max(), 1e-12), name
    assert abs(got.residual - ref.residual).max() <= 1e-4 * max(abs(ref.f_full), 1)


# ------------------------------------------------------------------ issue 53: host syncs in passes
def test_op_counter_counts_the_ops_that_wait_for_the_device():
    """item(), nonzero, boolean-mask indexing and a blocking copy between the host and another
    device count as host synchronisations (with their place in attattr's code, where asked);
    long-tensor indexing and a non-blocking copy do not; a region entered again inside itself
    is one entry."""
    from attattr_cli.ops.graphs import OpCounter

    x = torch.arange(6.0)
    with OpCounter(where=True) as counter:
        with counter.region("pass"):
            with counter.region("pass"):
                x.index_select(0, torch.tensor([1, 2]))
                x[torch.tensor([0, 3])]
                x.to("meta", non_blocking=True)
        x.sum().item()
        torch.nonzero(x > 2)
        x[x > 2]
        x.to("meta")
    assert counter.entries["pass"] == 1
    assert counter.regions["pass"].syncs == 0 and counter.regions["pass"].launching > 0
    assert counter.all.syncs == 4, counter.all.sync_sites
    assert sum(counter.all.sync_sites.values()) == 4
    assert all(site.startswith("test_kernels.py:") for site in counter.all.sync_sites), counter.all.sync_sites


def test_bench_kernel_counts_no_host_syncs_inside_passes_on_cpu():
    """--count-ops: one scored example's passes (sweeps, and one pass per layer) hold no host
    synchronisation; the ones left are between the passes."""
    bench = _bench_module("bench_kernel")
    for sweeps in (True, False):
        (row,) = bench.count_ops([32], steps=2, head_dims=(4,), sweeps=sweeps)
        assert row["passes"] >= 1 and row["pass_launching_ops"] > 0
        assert row["pass_syncs"] == 0, row["pass_sync_sites"]
        assert row["syncs"] == sum(row["sync_sites"].values()) > 0
