"""Production peers: the kernels serving engines ship, measured by the bench beside the versions.

Every peer here is an optional import, found one of two ways:

- a user's install: ``pip install vllm flashinfer-python liger-kernel humming-kernels`` (``import
  vllm._custom_ops``, ``import flashinfer``, ``import liger_kernel``, ``import humming``);
- the offline kit (``../shared/peers/README.md``): ``$LKW_PEERS_DIR`` names a folder holding the
  kit's files. Its wheels are installed into ``$LKW_PEERS_SITE`` (default /tmp/lkw_peers/site;
  ``tools/device_check.sh peers`` does it beforehand) and that folder goes on ``sys.path``; the
  FlashInfer AOT tarball is extracted into ``<site>/flashinfer/data/aot/`` so nothing compiles on
  the GPU; ``vllm_so/_C_*.so.xz`` are decompressed into ``$LKW_PEERS_CACHE`` (default
  /tmp/lkw_peers) and loaded with ``torch.ops.load_library``; ``vllm_so/vllm_scalar_type.py``
  gives Marlin's and Machete's type ids.

A library that is absent raises ``Absent`` with the reason; the bench prints it and records no row,
it never fakes one. The calling conventions are those of the kit (vLLM 0.34.0, FlashInfer
0.6.18.post1, Liger 0.8.5, checked on the H200 by the kit's peer_test.py); another version whose
signature differs makes its peer "not run here" with the error.

A peer factory is ``factory(torch, typed_inputs) -> PeerCall``: it prepares what the library
needs (its own weight packing, its own buffers) untimed, and the bench times ``PeerCall()`` exactly
as it times the torch peers: one launch after an L2 flush, back to back over one PeerCall per
rotated input set, and in a CUDA graph. The factories never write the bench's input tensors: an
in-place kernel (vLLM's fused_add_rms_norm writes its input and residual) works on copies that
``PeerCall.reset`` restores from the pristine inputs, untimed. Repeated timed calls run on the
values the previous call left there; these kernels' times do not depend on the values, and every
check after timing calls ``reset`` first. An op whose outputs are updated in place (chapter 05's KV
caches, ``lkw.bench.Case.initial_outputs``) hands its factories the inputs followed by the outputs'
initial contents: the peer writes copies of its own, which its ``reset`` restores.
"""

from __future__ import annotations

import importlib
import importlib.util
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

KIT_ENV = "LKW_PEERS_DIR"
SITE_ENV = "LKW_PEERS_SITE"
CACHE_ENV = "LKW_PEERS_CACHE"
LIBRARIES = ("vllm", "flashinfer", "liger", "humming")

# Wheel (distribution) name -> the package it installs, for the kit's wheels.
_KIT_PACKAGES = {"flashinfer_python": "flashinfer", "apache_tvm_ffi": "tvm_ffi",
                 "liger_kernel": "liger_kernel", "humming_kernels": "humming"}


class Absent(Exception):
    """A peer library that is not here; str() says why."""


@dataclass
class PeerCall:
    """One prepared peer. `call()` runs the library's kernel(s) and returns the op's outputs in the
    op's order (None for an output the peer does not produce comparably). `reset()` restores the
    inputs an in-place kernel overwrote (untimed). `checked` lists the outputs compared with the
    reference (None: all); `extra_check(outputs) -> (ok, text)` checks what the reference cannot
    (a different quantization of the same values); `summary` says what runs, where neither torch's
    version nor a library's names it (another chapter's registered kernel)."""

    call: Callable[[], Sequence]
    reset: Callable[[], None] | None = None
    checked: tuple[int, ...] | None = None
    extra_check: Callable[[Sequence], tuple[bool, str]] | None = None
    summary: str | None = None

    def __call__(self):
        return self.call()


# ------------------------------------------------------------------------------------------------
# Finding the libraries

_LOADED: dict[str, object] = {}
_ABSENT: dict[str, str] = {}
_DETAIL: dict[str, str] = {}


def kit_dir() -> Path | None:
    d = os.environ.get(KIT_ENV)
    return Path(d) if d else None


def _cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "/tmp/lkw_peers")


def _site() -> Path:
    return Path(os.environ.get(SITE_ENV) or _cache() / "site")


def _flashinfer_env() -> None:
    # The kit has FlashInfer's CUDA norm modules prebuilt (no CuTe DSL), for sm_90 only; its JIT
    # cache goes under /tmp, never into the repository.
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(_cache() / "fi_ws"))
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("FLASHINFER_USE_CUDA_NORM", "1")
    os.environ.setdefault("FLASHINFER_LOGLEVEL", "0")


def _installed(site: Path, wheel: Path) -> bool:
    dist = wheel.name.split("-")[0]
    return any(site.glob(f"{dist}-*.dist-info"))


def prepare_kit(kit: Path, log=print) -> None:
    """Install the kit's wheels into the site folder (once), put it on sys.path, extract the
    FlashInfer AOT modules into the installed package, set FlashInfer's environment."""
    site = _site()
    wheels = sorted(kit.glob("*.whl"))
    missing = [w for w in wheels if not _installed(site, w)]
    if missing:
        site.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--target", str(site), *map(str, missing)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log(f"peers: installing the kit's wheels into {site} failed: {proc.stderr.strip()[-500:]}")
    if site.is_dir() and str(site) not in sys.path:
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    _flashinfer_env()
    tarballs = sorted(kit.glob("fi_aot_*.tar.xz"))
    spec = importlib.util.find_spec("flashinfer") if tarballs else None
    if spec and spec.submodule_search_locations:
        aot = Path(next(iter(spec.submodule_search_locations))) / "data" / "aot"
        done = aot / ".lkw_extracted"
        names = "\n".join(t.name for t in tarballs)
        if not (done.is_file() and done.read_text() == names):
            try:
                aot.mkdir(parents=True, exist_ok=True)
                for t in tarballs:
                    with tarfile.open(t) as tf:
                        if hasattr(tarfile, "data_filter"):
                            tf.extractall(aot, filter="data")
                        else:  # Python before the extraction filters: the kit's own tarball
                            tf.extractall(aot)
                done.write_text(names)
            except OSError as e:
                log(f"peers: FlashInfer AOT modules not extracted into {aot}: {e}")


_KIT_PREPARED = False


def _prepare(log=print) -> None:
    global _KIT_PREPARED
    kit = kit_dir()
    if kit is not None and not _KIT_PREPARED:
        _KIT_PREPARED = True
        if kit.is_dir():
            prepare_kit(kit, log=log)
        else:
            log(f"peers: {KIT_ENV}={kit} is not a folder")
    _flashinfer_env()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


@dataclass
class VLLM:
    ops: object  # torch.ops._C
    scalar_types: object  # vllm.scalar_type.scalar_types (Marlin/Machete type ids)
    moe: object = None  # torch.ops._moe_C (align, top-k routing), where its library loaded
    cache_ops: object = None  # torch.ops._C_cache_ops (reshape_and_cache*), a namespace of _C's library


def _load_vllm(torch) -> tuple[VLLM, str]:
    kit = kit_dir()
    libs = sorted((kit / "vllm_so").glob("*_C_*.so.xz")) if kit else []  # _C_ and _moe_C_
    if libs:
        out_dir = _cache() / "vllm_so"
        out_dir.mkdir(parents=True, exist_ok=True)
        for xz in libs:
            so = out_dir / xz.name[: -len(".xz")]
            if not so.exists() or so.stat().st_mtime < xz.stat().st_mtime:
                tmp = so.with_suffix(".part")
                with lzma.open(xz) as fi, open(tmp, "wb") as fo:
                    shutil.copyfileobj(fi, fo, 1 << 24)
                tmp.replace(so)
            torch.ops.load_library(str(so))
        sys.path.insert(0, str(kit / "vllm_so"))
        from vllm_scalar_type import scalar_types

        moe = torch.ops._moe_C if any(x.name.startswith("_moe_C") for x in libs) else None
        return (VLLM(torch.ops._C, scalar_types, moe, torch.ops._C_cache_ops),
                f"vLLM kernel libraries ({', '.join(x.stem for x in libs)}, peer kit)")
    import vllm
    import vllm._custom_ops
    from vllm.scalar_type import scalar_types

    try:
        import vllm._moe_C  # registers torch.ops._moe_C

        moe = torch.ops._moe_C
    except ImportError:
        moe = None
    return VLLM(torch.ops._C, scalar_types, moe, torch.ops._C_cache_ops), f"vLLM {getattr(vllm, '__version__', '?')} (installed)"


def _load_flashinfer(torch):
    import flashinfer

    where = "kit" if kit_dir() else "installed"
    return flashinfer, f"FlashInfer {getattr(flashinfer, '__version__', '?')} ({where})"


def _load_liger(torch):
    import liger_kernel
    from liger_kernel.ops import fused_add_rms_norm, rms_norm

    version = getattr(liger_kernel, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("liger_kernel")
        except Exception:  # noqa: BLE001  (a version string only)
            version = "?"
    where = "kit" if kit_dir() else "installed"
    return {"fused_add_rms_norm": fused_add_rms_norm, "rms_norm": rms_norm}, f"Liger {version} ({where})"


def _humming_env() -> None:
    # humming JIT-compiles its kernels (nvcc/NVRTC) on a shape's first call and caches them: the
    # cache goes under /tmp, never into the repository.
    os.environ.setdefault("HUMMING_CACHE_DIR", str(_cache() / "humming_cache"))
    if "CUDA_HOME" not in os.environ and Path("/usr/local/cuda").is_dir():
        os.environ["CUDA_HOME"] = "/usr/local/cuda"


def _load_humming(torch):
    _humming_env()
    import humming
    from humming.layer import HummingLayer

    version = getattr(humming, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("humming_kernels")
        except Exception:  # noqa: BLE001  (a version string only)
            version = "?"
    where = "kit" if kit_dir() else "installed"
    return HummingLayer, f"humming {version} ({where})"


_LOADERS = {"vllm": _load_vllm, "flashinfer": _load_flashinfer, "liger": _load_liger, "humming": _load_humming}


def library(name: str, log=print):
    """The loaded library (cached), or raises Absent with the reason (cached too)."""
    if name in _LOADED:
        return _LOADED[name]
    if name in _ABSENT:
        raise Absent(_ABSENT[name])
    _prepare(log=log)
    try:
        import torch

        lib, detail = _LOADERS[name](torch)
    except Exception as e:  # noqa: BLE001  (any failure to load is a reason to skip, recorded)
        how = f"{KIT_ENV}={kit_dir()}" if kit_dir() else f"no {KIT_ENV} set and no install"
        _ABSENT[name] = f"{name} not available ({how}): {_first_line(e)}"
        raise Absent(_ABSENT[name]) from None
    _LOADED[name] = lib
    _DETAIL[name] = detail
    return lib


def status(log=print) -> dict[str, dict]:
    """{library: {"available": bool, "detail": what was loaded, or why not}} for the run's header,
    loading each library once."""
    out = {}
    for name in LIBRARIES:
        try:
            library(name, log=log)
            out[name] = {"available": True, "detail": _DETAIL[name]}
        except Absent as e:
            out[name] = {"available": False, "detail": str(e)}
    return out


def status_of(name: str) -> str:
    """What was loaded for a library (the peer rows' summary), or why it is absent."""
    return _DETAIL.get(name) or _ABSENT.get(name) or f"{name}: not loaded yet"


def reset_cache() -> None:
    """Forget what was loaded or found absent (tests)."""
    global _KIT_PREPARED
    _LOADED.clear()
    _ABSENT.clear()
    _DETAIL.clear()
    _KIT_PREPARED = False


# ------------------------------------------------------------------------------------------------
# Chapter 03: dynamic activation quantization. Inputs [x bf16 [T, d]].

# vLLM's per-group floor is max(absmax, eps) / 448; with eps = 448 * MIN_SCALE = 1/512 it is the
# contract's max(absmax / 448, MIN_SCALE) (lkw.quant), bit for bit in FP32.
GROUP_EPS = 1.0 / 512


def quant_peers(op: str) -> dict[str, Callable]:
    """vLLM's kernels for chapter 03's ops (none for per_tensor_fp8: vLLM's dynamic per-tensor quant
    needs a zeroed scale each call and has no minimum scale)."""

    def per_token(dtype_name: str, kernel: str):
        """vLLM's per-token quant `kernel` into q of torch.`dtype_name` and one FP32 scale a row."""

        def factory(torch, ins):
            ops = library("vllm").ops
            (x,) = ins
            q = torch.empty(x.shape, dtype=getattr(torch, dtype_name), device=x.device)
            s = torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)

            def call():
                getattr(ops, kernel)(q, x, s, None)
                return q, s

            return PeerCall(call)

        return factory

    per_token_fp8 = per_token("float8_e4m3fn", "dynamic_per_token_scaled_fp8_quant")
    per_token_int8 = per_token("int8", "dynamic_scaled_int8_quant")

    def per_group_fp8(torch, ins):
        ops = library("vllm").ops
        (x,) = ins
        t, d = x.shape
        q = torch.empty(t, d, dtype=torch.float8_e4m3fn, device=x.device)
        # vLLM's own row-major scales [T, d/128] (the same bytes as ours); handed to the check as
        # the [d/128, T] view the op's column-major output has.
        s = torch.empty(t, d // 128, dtype=torch.float32, device=x.device)

        def call():
            ops.per_token_group_fp8_quant(x, q, s, 128, GROUP_EPS, -448.0, 448.0, False, False,
                                          False)
            return q, s.t()

        return PeerCall(call)

    table = {
        "per_token_fp8": {"vllm dynamic_per_token_scaled_fp8_quant": per_token_fp8},
        "per_token_int8": {"vllm dynamic_scaled_int8_quant": per_token_int8},
        "per_group_fp8": {"vllm per_token_group_fp8_quant": per_group_fp8},
    }
    return table.get(op, {})


# ------------------------------------------------------------------------------------------------
# Chapter 04: RMSNorm and its fusions. Inputs [x, (residual,) w], all BF16.

# A static-scale peer's q against y = RMSNorm(x + residual) * w dequantized with its one scale:
# E4M3 rounds to 2^-4 of the value (normals) and 2^-10 of the scale (subnormals); the peer's y may
# differ from the torch one by a BF16 rounding (2^-8).
STATIC_RTOL = 2.0**-4 + 2.0**-7
STATIC_ATOL_SCALES = 2.0**-9


def _hf_norm(torch, v, w, eps):
    """y = w * bf16(v * rsqrt(mean(v^2) + eps)) in FP32 (the Hugging Face Llama RMSNorm)."""
    h = v.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w.float() * h.to(torch.bfloat16).float()


def _copies(torch, tensors):
    work = [t.clone() for t in tensors]

    def reset():
        for w, t in zip(work, tensors):
            w.copy_(t)

    return work, reset


def norm_peers(op: str, eps: float) -> dict[str, Callable]:
    """vLLM, FlashInfer and Liger kernels for chapter 04's ops, at the case's eps (the group op:
    vLLM's rms_norm_per_block_quant)."""

    def vllm_rms_norm(torch, ins):
        ops = library("vllm").ops
        x, w = ins
        y = torch.empty_like(x)

        def call():
            ops.rms_norm(y, x, w, eps)
            return (y,)

        return PeerCall(call)

    def flashinfer_rmsnorm(torch, ins):
        fi = library("flashinfer")
        x, w = ins
        y = torch.empty_like(x)

        def call():
            fi.rmsnorm(x, w, eps, out=y)
            return (y,)

        return PeerCall(call)

    def liger_rms_norm(torch, ins):
        forward = library("liger")["rms_norm"].rms_norm_forward
        x, w = ins
        return PeerCall(lambda: (forward(x, w, eps, 0.0, "llama", None)[0],))

    def vllm_fused_add(torch, ins):
        ops = library("vllm").ops
        (x, res), reset = _copies(torch, ins[:2])
        w = ins[2]

        def call():  # x <- RMSNorm(x + res) * w, res <- x + res
            ops.fused_add_rms_norm(x, res, w, eps)
            return x, res

        return PeerCall(call, reset=reset)

    def flashinfer_fused_add(torch, ins):
        fi = library("flashinfer")
        (x, res), reset = _copies(torch, ins[:2])
        w = ins[2]

        def call():
            fi.fused_add_rmsnorm(x, res, w, eps)
            return x, res

        return PeerCall(call, reset=reset)

    def liger_fused_add(torch, ins):
        forward = library("liger")["fused_add_rms_norm"].fused_add_rms_norm_forward
        x, res, w = ins
        return PeerCall(lambda: forward(x, res, w, eps, 0.0, "llama")[:2])  # out of place

    def vllm_dynamic_quant(dtype_name):
        def factory(torch, ins):
            ops = library("vllm").ops
            x, res_in, w = ins
            (res,), reset = _copies(torch, [res_in])
            t, d = x.shape
            q = torch.empty(t, d, dtype=getattr(torch, dtype_name), device=x.device)
            s = torch.empty(t, 1, dtype=torch.float32, device=x.device)

            def call():  # res <- x + res; q, s <- per-token quant of RMSNorm(res) * w
                ops.rms_norm_dynamic_per_token_quant(q, x, w, s, eps, None, res)
                return q, s, res

            return PeerCall(call, reset=reset)

        return factory

    def vllm_per_block_quant(torch, ins):
        """vLLM's rms_norm_per_block_quant (q, x, w, scales, eps, scale_ub, residual, group_size,
        is_scale_transposed): with the residual, res <- x + res in place (on a copy, as above);
        groups of 128, no scale_ub, scales transposed: [d/128, T], the op's column-major layout.
        Like its per-token kernel it takes the variance of the unrounded FP32 sum (lkw.rmsnorm
        says so), so its q and scales are compared within the op's tolerance, not exactly."""
        ops = library("vllm").ops
        x, res_in, w = ins
        (res,), reset = _copies(torch, [res_in])
        t, d = x.shape
        q = torch.empty(t, d, dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty(d // 128, t, dtype=torch.float32, device=x.device)

        def call():  # res <- x + res; q, s <- per-group quant of RMSNorm(res) * w
            ops.rms_norm_per_block_quant(q, x, w, s, eps, None, res, 128, True)
            return q, s, res

        return PeerCall(call, reset=reset)

    def static_quant(lib):
        """The static per-tensor FP8 scale peers: a different quantization from the op's (one
        scale for the tensor, given, not one per token computed), so only the residual is compared
        with the reference; q is checked against y / scale within STATIC_RTOL, STATIC_ATOL_SCALES.
        The scale is the tensor's absmax(y) / 448, computed untimed, so nothing saturates."""

        def factory(torch, ins):
            x0, res0, w = ins
            (x, res), reset = _copies(torch, [x0, res0])
            t, d = x.shape
            y = _hf_norm(torch, (x0.float() + res0.float()).to(torch.bfloat16), w, eps)
            scale = (y.abs().amax() / 448.0).reshape(1).to(torch.float32)
            del y
            q = torch.empty(t, d, dtype=torch.float8_e4m3fn, device=x.device)
            if lib == "vllm":
                ops = library("vllm").ops

                def call():
                    ops.fused_add_rms_norm_static_fp8_quant(q, x, res, w, scale, eps)
                    return q, None, res
            else:
                fi = library("flashinfer")

                def call():
                    fi.fused_add_rmsnorm_quant(q, x, res, w, scale, eps)
                    return q, None, res

            def extra_check(outs):
                y = _hf_norm(torch, (x0.float() + res0.float()).to(torch.bfloat16), w, eps)
                deq = outs[0].float() * scale
                err = (deq - y).abs()
                bound = STATIC_RTOL * y.abs() + STATIC_ATOL_SCALES * scale
                bad = int((err > bound).sum())
                text = (f"q * scale vs y (static scale {float(scale):.4g}): {bad} of {err.numel()} beyond "
                        f"{STATIC_RTOL:.4g}|y| + {STATIC_ATOL_SCALES:.4g} scale")
                return bad == 0, text

            return PeerCall(call, reset=reset, checked=(2,), extra_check=extra_check)

        return factory

    table = {
        "rmsnorm": {"vllm rms_norm": vllm_rms_norm, "flashinfer rmsnorm": flashinfer_rmsnorm,
                    "liger rms_norm": liger_rms_norm},
        "fused_add_rmsnorm": {"vllm fused_add_rms_norm": vllm_fused_add,
                              "flashinfer fused_add_rmsnorm": flashinfer_fused_add,
                              "liger fused_add_rms_norm": liger_fused_add},
        "fused_add_rmsnorm_fp8": {
            "vllm rms_norm_dynamic_per_token_quant": vllm_dynamic_quant("float8_e4m3fn"),
            "vllm fused_add_rms_norm_static_fp8_quant (static scale)": static_quant("vllm"),
            "flashinfer fused_add_rmsnorm_quant (static scale)": static_quant("flashinfer"),
        },
        "fused_add_rmsnorm_int8": {"vllm rms_norm_dynamic_per_token_quant": vllm_dynamic_quant("int8")},
        "fused_add_rmsnorm_fp8_group": {"vllm rms_norm_per_block_quant": vllm_per_block_quant},
    }
    return table.get(op, {})


# ------------------------------------------------------------------------------------------------
# Chapter 06: W4A16 GEMV/GEMM. Inputs [x bf16 [M, K], words int32 [N, K/8], scales bf16 [N, K/G]];
# y = x @ W^T with W[n, k] = scales[n, k // G] * (q[n, k] - 8): GPTQ's uint4b8 with group scales.

_PACK_ROWS = 4096  # weight rows packed at a time (bounds the temporary int64 nibbles)


def gptq_pack(torch, q):
    """4-bit values q [N, K] (0..15) -> GPTQ words [K/8, N] int32: word [i, n] holds q[n, 8i + j]
    in bits 4j..4j+3."""
    n, k = q.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=q.device)
    words = (q.t().reshape(k // 8, 8, n).to(torch.int64) << shifts[None, :, None]).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def marlin_permute_scales(torch, s, size_k: int, size_n: int, group_size: int):
    """vLLM's marlin_permute_scales (marlin_utils.py): scales [K/G, N] into Marlin's order."""
    perm = [i + 8 * j for i in range(8) for j in range(8)]
    single = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
    if group_size < size_k and group_size != -1:
        s = s.reshape((-1, len(perm)))[:, perm]
    else:
        s = s.reshape((-1, len(single)))[:, single]
    return s.reshape((-1, size_n)).contiguous()


def marlin_call(torch, x, gptq_words, scales, g: int) -> PeerCall:
    """vLLM's Marlin (marlin_gemm, uint4b8) on GPTQ words [K/8, N] int32 and scales [K/G, N] BF16,
    packed by its own gptq_marlin_repack and marlin_permute_scales (untimed)."""
    v = library("vllm")
    m, k = x.shape
    n = gptq_words.shape[1]
    packed = v.ops.gptq_marlin_repack(gptq_words.contiguous(), k, n, 4)
    s = marlin_permute_scales(torch, scales.contiguous(), k, n, g)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    workspace = torch.zeros(sms * 4, dtype=torch.int32, device=x.device)  # locks, left zero
    tid = v.scalar_types.uint4b8.id
    torch.cuda.synchronize()

    def call():
        return (v.ops.marlin_gemm(x, None, packed, None, s, None, None, workspace, tid, m, n, k,
                                  False, True, False),)

    return PeerCall(call)


def machete_call(torch, x, gptq_words, scales, g: int) -> PeerCall:
    """vLLM's Machete (machete_mm, uint4b8) on GPTQ words [K/8, N] int32 and scales [K/G, N] BF16;
    machete_prepack_B takes the words column-major ([K/8, N] with K/8 contiguous)."""
    v = library("vllm")
    tid = v.scalar_types.uint4b8.id
    column_major = gptq_words.t().contiguous().t()
    packed = v.ops.machete_prepack_B(column_major, torch.bfloat16, tid, torch.bfloat16)
    s = scales.contiguous()
    del column_major
    torch.cuda.synchronize()

    def call():
        return (v.ops.machete_mm(x, packed, tid, None, s, None, g, None, None, None),)

    return PeerCall(call)


def humming_call(torch, x, gptq_words, scales, g: int) -> PeerCall:
    """humming's HummingLayer loaded from a symmetric GPTQ checkpoint (qweight = GPTQ words
    [K/8, N], scales [K/G, N]: uint4 without zero point means q - 8, as ours) and transformed by
    humming itself (untimed). Its first forward JIT-compiles the kernel for the shape (11-13 s on
    the H200): done here, outside timing."""
    layer_cls = library("humming")
    k, n = 8 * gptq_words.shape[0], gptq_words.shape[1]
    config = {"quant_method": "gptq", "bits": 4, "group_size": g, "sym": True, "desc_act": False}
    layer = layer_cls(shape_n=n, shape_k=k, weight_config=config, torch_dtype=torch.bfloat16).to(x.device)
    layer.load_from_tensors({"qweight": gptq_words, "scales": scales})
    layer.transform()
    layer(x)
    torch.cuda.synchronize()
    return PeerCall(lambda: (layer(x),))


def gemv_peers(interleaved: bool, nibbles: Callable) -> dict[str, Callable]:
    """Marlin and Machete on chapter 06's weights, each packed with the library's own packer from
    the GPTQ words of the same q (untimed). `nibbles(torch, words, interleaved)` turns our words
    into q [R, K] in element order; the scales [N, K/G] go in transposed."""

    def gptq_of(torch, words):
        n = words.shape[0]
        k = 8 * words.shape[1]
        out = torch.empty(k // 8, n, dtype=torch.int32, device=words.device)
        for r in range(0, n, _PACK_ROWS):
            out[:, r : r + _PACK_ROWS] = gptq_pack(torch, nibbles(torch, words[r : r + _PACK_ROWS], interleaved))
        return out

    def on_gptq(call):
        def factory(torch, ins):
            library("vllm")  # absent: skipped before the inputs are touched
            x, words, scales = ins
            g = x.shape[1] // scales.shape[1]
            return call(torch, x, gptq_of(torch, words), scales.t().contiguous(), g)

        return factory

    return {"vllm marlin_gemm": on_gptq(marlin_call), "vllm machete_mm": on_gptq(machete_call)}


# ------------------------------------------------------------------------------------------------
# Chapter 07: W4A16 GEMM. Inputs [x bf16 [M, K], words int32 [N, K/8] in the natural nibble order,
# scales bf16 [K/G, N] (group-major, as GPTQ's)]. Natural words transposed are GPTQ's qweight.

W4A16_PEERS = {"vllm marlin_gemm": marlin_call, "vllm machete_mm": machete_call,
               "humming HummingLayer": humming_call}


def w4a16_peers() -> dict[str, Callable]:
    """Marlin, Machete and humming on chapter 07's weights: GPTQ words = our natural words
    transposed (element k of row n at nibble k % 8 of word [k // 8, n] in both), scales as they
    are; each library packs them its own way (untimed)."""

    def on_natural(lib, call):
        def factory(torch, ins):
            library(lib)  # absent: skipped before the inputs are touched
            x, words, scales = ins
            g = x.shape[1] // scales.shape[0]
            return call(torch, x, words.view(torch.int32).t().contiguous(), scales, g)

        return factory

    return {name: on_natural(name.split()[0], call) for name, call in W4A16_PEERS.items()}


# ------------------------------------------------------------------------------------------------
# Chapter 08: the W8A8 FP8 GEMM. Inputs [A e4m3 [M, K], B e4m3 [N, K], s_a, s_b float32] whose
# shapes name the granularity (lkw.fp8_gemm): [1], [1]; [M, 1], [N, 1]; or blockwise [K/128, M]
# (1 x 128 groups, M contiguous) and [ceil(N/128), K/128] (128 x 128 blocks).


def fp8_gemm_peers(granularity: str) -> dict[str, Callable]:
    """vLLM's CUTLASS cutlass_scaled_mm at every granularity, FlashInfer's fp8_blockscale_gemm_sm90
    (DeepGEMM's kernel) for blockwise scales. Both read B as B^T [K, N] column-major (our [N, K]
    rows: b.t(), no copy) and the blockwise activation scales as [M, K/128] with M contiguous (our
    [K/128, M]: s_a.t(), the same bytes; the kit's README: FlashInfer silently computes wrong
    results from contiguous [M, K/128] scales). vLLM takes the weight scales against B^T,
    [K/128, N/128] (s_b.t()), per-token and per-channel scales by their element count, FlashInfer
    the weight scales as they are."""

    def vllm_cutlass(torch, ins):
        ops = library("vllm").ops
        a, b, s_a, s_b = ins
        out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=a.device)
        sa, sb = (s_a.t(), s_b.t()) if granularity == "blockwise" else (s_a, s_b)

        def call():
            ops.cutlass_scaled_mm(out, a, b.t(), sa, sb, None)
            return (out,)

        return PeerCall(call)

    def flashinfer_blockscale(torch, ins):
        library("flashinfer")  # absent: skipped before the inputs are touched
        from flashinfer.gemm import fp8_blockscale_gemm_sm90

        a, b, s_a, s_b = ins
        out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=a.device)
        sa = s_a.t()  # (M,K/128), M contiguous

        def call():
            fp8_blockscale_gemm_sm90(a, b, sa, s_b, out=out)
            return (out,)

        return PeerCall(call)

    table = {"vllm cutlass_scaled_mm": vllm_cutlass}
    if granularity == "blockwise":
        table["flashinfer fp8_blockscale_gemm_sm90"] = flashinfer_blockscale
    return table


# ------------------------------------------------------------------------------------------------
# Chapter 09: MoE routing. align: inputs [topk_ids int32 [T, k]], outputs [sorted_token_ids,
# expert_ids, num_tokens_post_padded]; topk_softmax: inputs [logits f32 [T, E]], outputs
# [weights f32 [T, k], ids int32 [T, k]].


def _vllm_moe():
    lib = library("vllm")
    if lib.moe is None:
        raise Absent("vLLM's MoE kernel library (_moe_C) is not loaded")
    return lib.moe


def moe_peers(op: str, num_experts: int = 0, block_m: int = 0, k: int = 0,
              renormalize: bool = False) -> dict[str, Callable]:
    """vLLM's moe_align_block_size (its sorted ids and the padded total are checked; its expert ids
    for the blocks after the runs are not written by the kernel) and topk_softmax, which takes FP32
    or BF16 gating logits (the peer of topk_softmax_bf16 too; a build without the BF16 path fails
    its call and the bench records it as not running)."""

    def align(torch, inputs):
        moe = _vllm_moe()
        (ids,) = inputs
        worst = ids.numel() + num_experts * (block_m - 1)
        cap = -(-worst // block_m) * block_m
        sorted_ids = torch.empty(cap, dtype=torch.int32, device=ids.device)
        expert_ids = torch.empty(cap // block_m, dtype=torch.int32, device=ids.device)
        post = torch.empty(1, dtype=torch.int32, device=ids.device)

        def call():
            moe.moe_align_block_size(ids, num_experts, block_m, sorted_ids, expert_ids, post, None)
            return sorted_ids, expert_ids, post

        return PeerCall(call, checked=(0, 2))

    def topk_softmax(torch, inputs):
        moe = _vllm_moe()
        (logits,) = inputs
        t = logits.shape[0]
        weights = torch.empty(t, k, dtype=torch.float32, device=logits.device)
        ids = torch.empty(t, k, dtype=torch.int32, device=logits.device)
        token_expert = torch.empty(t, k, dtype=torch.int32, device=logits.device)

        def call():
            moe.topk_softmax(weights, ids, token_expert, logits, renormalize, None, None)
            return weights, ids

        return PeerCall(call)

    return {"moe_align_block_size": {"vllm moe_align_block_size": align},
            "topk_softmax": {"vllm topk_softmax": topk_softmax},
            "topk_softmax_bf16": {"vllm topk_softmax": topk_softmax}}.get(op, {})


# ------------------------------------------------------------------------------------------------
# Chapter 05: the elementwise ops. Gated activations: inputs [x bf16 [T, 2d]] (and the static FP8
# form's scale f32 [1]). RoPE: [positions int64 [T], q bf16 [T, Hq, D], k bf16 [T, Hk, D],
# cos_sin_cache f32 [max_pos, rot_dim]], qk_norm_rope with q_weight, k_weight bf16 [D] before the
# cache. reshape_and_cache: [key, value bf16 [T, Hk, D], slot_mapping int64 [T] (, k_scale,
# v_scale f32 [1])] followed by the caches' initial contents (lkw.bench.Case.initial_outputs): the
# caches are updated in place, so a peer writes copies of its own that its reset restores.


def _flashinfer_prebuilt(module: str) -> None:
    """With the offline kit, FlashInfer's modules come prebuilt (fi_aot_*.tar.xz: norm, rope,
    silu_and_mul, ...); one that is not among them would JIT-compile on the GPU (minutes of its
    time, the kit's README says): skipped instead, saying why. A user's own install compiles."""
    if kit_dir() is None:
        return
    spec = importlib.util.find_spec("flashinfer")
    aot = Path(next(iter(spec.submodule_search_locations))) / "data" / "aot" / module
    if not aot.is_dir():
        raise Absent(f"FlashInfer's {module} module is not prebuilt in the peer kit ({aot} missing): "
                     "it would JIT-compile on the GPU")


def _liger_op(module: str):
    library("liger")  # absent: skipped before the inputs are touched
    return importlib.import_module(f"liger_kernel.ops.{module}")


def act_peers(op: str) -> dict[str, Callable]:
    """vLLM's silu_and_mul and gelu_tanh_and_mul (out, x), its static per-tensor FP8
    silu_and_mul_quant (q, x, scale) and its per-group silu_and_mul_per_block_quant (q, x, scales,
    group 128, no scale_ub, scales transposed: [d/128, T], the op's layout); FlashInfer's
    silu_and_mul and gelu_tanh_and_mul (x, out=); Liger's swiglu_fused_gate_up_forward (x) ->
    (x, y). vLLM and Liger round silu(gate) to BF16 before the multiply (lkw.bench says what
    tolerance that takes); vLLM's per-group kernel keeps y in FP32 before the absmax; none of them
    computes the per-token FP8 form (vLLM's per-block kernel takes groups of 64 or 128 only).
    FlashInfer's gelu_tanh uses tanh.approx.f32 (2^-11 relative), which lkw.elementwise shows is
    not accurate enough where 1 + tanh cancels: its row may fail the check there, saying where
    (and the kit does not prebuild that module: with the kit it is skipped)."""

    def out_like(torch, x, dtype=None):
        return torch.empty(x.shape[0], x.shape[1] // 2, dtype=dtype or x.dtype, device=x.device)

    def vllm_act(kernel: str):
        def factory(torch, ins):
            ops = library("vllm").ops
            (x,) = ins
            out = out_like(torch, x)

            def call():
                getattr(ops, kernel)(out, x)
                return (out,)

            return PeerCall(call)

        return factory

    def flashinfer_act(kernel: str):
        def factory(torch, ins):
            fi = library("flashinfer")
            _flashinfer_prebuilt(kernel)
            (x,) = ins
            out = out_like(torch, x)
            fn = getattr(fi, kernel)
            return PeerCall(lambda: (fn(x, out=out),))

        return factory

    def liger_swiglu(torch, ins):
        swiglu = _liger_op("swiglu")
        (x,) = ins
        return PeerCall(lambda: (swiglu.swiglu_fused_gate_up_forward(x)[1],))

    def vllm_static_fp8(torch, ins):
        ops = library("vllm").ops
        x, scale = ins
        q = out_like(torch, x, torch.float8_e4m3fn)

        def call():  # q = e4m3(bf16(silu(gate)) * up * (1 / scale))
            ops.silu_and_mul_quant(q, x, scale)
            return (q,)

        return PeerCall(call)

    def vllm_per_group(torch, ins):
        ops = library("vllm").ops
        (x,) = ins
        q = out_like(torch, x, torch.float8_e4m3fn)
        scales = torch.empty(q.shape[1] // 128, q.shape[0], dtype=torch.float32, device=x.device)

        def call():
            ops.silu_and_mul_per_block_quant(q, x, scales, 128, None, True)
            return q, scales

        return PeerCall(call)

    table = {
        "silu_and_mul": {"vllm silu_and_mul": vllm_act("silu_and_mul"),
                         "flashinfer silu_and_mul": flashinfer_act("silu_and_mul"),
                         "liger swiglu_fused_gate_up_forward": liger_swiglu},
        "gelu_tanh_and_mul": {"vllm gelu_tanh_and_mul": vllm_act("gelu_tanh_and_mul"),
                              "flashinfer gelu_tanh_and_mul": flashinfer_act("gelu_tanh_and_mul")},
        "gelu_and_mul": {"vllm gelu_and_mul": vllm_act("gelu_and_mul"),
                         "flashinfer gelu_and_mul": flashinfer_act("gelu_and_mul")},
        "silu_and_mul_fp8_per_group": {"vllm silu_and_mul_per_block_quant": vllm_per_group},
        "silu_and_mul_fp8_per_tensor": {"vllm silu_and_mul_quant (static scale)": vllm_static_fp8},
    }
    return table.get(op, {})


def rope_peers(is_neox: bool = True) -> dict[str, Callable]:
    """vLLM's rotary_embedding (positions, q, k, head_size, cos_sin_cache, is_neox), in place on
    copies of q and k (reset restores them); FlashInfer's apply_rope_with_cos_sin_cache (positions,
    q, k, head_size, cos_sin_cache, is_neox) -> (q_out, k_out), out of place as the op (it also has
    apply_rope_with_cos_sin_cache_inplace, vLLM's convention); Liger's rope_forward (q, k, cos,
    sin) on (1, H, T, D) views of the heads, in place, NEOX only, with cos and sin [1, T, rot_dim]
    gathered from the cache at the positions untimed (a Hugging Face model computes them once per
    step for every layer). All three read the FP32 cache and rotate in FP32."""

    def vllm_rotary(torch, ins):
        ops = library("vllm").ops
        pos, q0, k0, cache = ins
        (q, k), reset = _copies(torch, [q0, k0])

        def call():
            ops.rotary_embedding(pos, q, k, q.shape[-1], cache, is_neox)
            return q, k

        return PeerCall(call, reset=reset)

    def flashinfer_rope(torch, ins):
        fi = library("flashinfer")
        _flashinfer_prebuilt("rope")
        pos, q, k, cache = ins
        return PeerCall(lambda: fi.apply_rope_with_cos_sin_cache(pos, q, k, q.shape[-1], cache, is_neox))

    def liger_rope(torch, ins):
        rope = _liger_op("rope")
        pos, q0, k0, cache = ins
        (q, k), reset = _copies(torch, [q0, k0])
        t, hq, d = q.shape
        rows = cache.index_select(0, pos)  # (T,R)
        half = rows.shape[1] // 2
        cos = torch.cat([rows[:, :half]] * 2, -1)[None].contiguous()  # (1,T,R): HF's layout
        sin = torch.cat([rows[:, half:]] * 2, -1)[None].contiguous()
        qv, kv = q.view(1, t, hq, d).transpose(1, 2), k.view(1, t, k.shape[1], d).transpose(1, 2)

        def call():
            rope.rope_forward(qv, kv, cos, sin)
            return q, k

        return PeerCall(call, reset=reset)

    table = {"vllm rotary_embedding": vllm_rotary, "flashinfer apply_rope_with_cos_sin_cache": flashinfer_rope}
    if is_neox:
        table["liger rope_forward"] = liger_rope
    return table


def qk_norm_rope_peers(eps: float, is_neox: bool = True) -> dict[str, Callable]:
    """vLLM's fused_qk_norm_rope (qkv, Hq, Hk, Hv, D, eps, q_weight, k_weight, cos_sin_cache,
    is_neox, positions), in place on the q and k heads of a [T, (Hq + 2 Hk) D] qkv buffer (the
    projection's output; V, untouched, left zero) that reset refills from the inputs. It keeps the
    normalized heads in FP32 before the rotation (no BF16 rounding between; the op's tolerance
    admits it) and needs D of 64, 128 or 256. FlashInfer's fused_qk_rmsnorm_rope is another
    operation (RMSNorm across heads, 3D RoPE for video models): not a peer."""

    def vllm_fused(torch, ins):
        ops = library("vllm").ops
        pos, q0, k0, q_weight, k_weight, cache = ins
        t, hq, d = q0.shape
        hk = k0.shape[1]
        qkv = torch.zeros(t, (hq + 2 * hk) * d, dtype=q0.dtype, device=q0.device)
        q = qkv[:, : hq * d].unflatten(1, (hq, d))
        k = qkv[:, hq * d : (hq + hk) * d].unflatten(1, (hk, d))

        def reset():
            q.copy_(q0)
            k.copy_(k0)

        reset()

        def call():
            ops.fused_qk_norm_rope(qkv, hq, hk, hk, d, eps, q_weight, k_weight, cache, is_neox, pos)
            return q, k

        return PeerCall(call, reset=reset)

    return {"vllm fused_qk_norm_rope": vllm_fused}


def cache_peers(layout: str, kv_dtype: str) -> dict[str, Callable]:
    """vLLM's reshape_and_cache (the paged layout) and reshape_and_cache_flash (NHD, and HND):
    (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale),
    kv_cache_dtype "auto" for a BF16 cache (the scales, ones, unused) and "fp8" for an E4M3 one,
    which vLLM keeps as bytes (uint8 views of the same caches). reshape_and_cache_flash takes the
    cache as [blocks, block, Hk, D] and addresses it through its strides (block, page, head), so
    an HND cache [blocks, Hk, block, D] goes in as its transposed view, as vLLM's own HND
    allocation does. vLLM's FP8 conversion divides by the scale, the contract multiplies by its
    reciprocal: one E4M3 code apart now and then. FlashInfer's append_paged_kv_cache takes batch
    indices and page tables instead of a slot mapping: not a peer of this signature."""
    kernel = {"paged": "reshape_and_cache", "nhd": "reshape_and_cache_flash",
              "hnd": "reshape_and_cache_flash"}.get(layout)
    if kernel is None:
        return {}
    fp8 = kv_dtype == "float8_e4m3fn"

    def factory(torch, ins):
        ops = library("vllm").cache_ops
        key, value, slots = ins[:3]
        if fp8:
            k_scale, v_scale = ins[3:5]
        else:
            k_scale = v_scale = torch.ones(1, dtype=torch.float32, device=key.device)
        (key_cache, value_cache), reset = _copies(torch, ins[-2:])
        kc, vc = (key_cache.view(torch.uint8), value_cache.view(torch.uint8)) if fp8 else (key_cache, value_cache)
        if layout == "hnd":  # [blocks, Hk, block, D] seen as [blocks, block, Hk, D]: head stride block·D
            kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)

        def call():
            getattr(ops, kernel)(key, value, kc, vc, slots, "fp8" if fp8 else "auto", k_scale, v_scale)
            return key_cache, value_cache

        return PeerCall(call, reset=reset)

    return {f"vllm {kernel}" + (" (HND strides)" if layout == "hnd" else ""): factory}


def qkv_rope_cache_peers() -> dict[str, Callable]:
    """vLLM's path for chapter 05's qkv_rope_cache (the paged layout, BF16 caches): its
    rotary_embedding in place on the query and key heads of (a copy of) qkv, as strided views,
    then reshape_and_cache of the rotated key heads and the value heads, two kernels; q_out is the
    rotated query view. Reset restores the copy of qkv and the caches (untimed)."""

    def vllm_chain(torch, ins):
        v = library("vllm")
        pos, qkv0, cos_sin, slots = ins[:4]
        (qkv, kc, vc), reset = _copies(torch, [qkv0, *ins[4:6]])
        hk = kc.shape[1]
        hq = qkv.shape[1] - 2 * hk
        q, k, val = qkv[:, :hq], qkv[:, hq : hq + hk], qkv[:, hq + hk :]
        one = torch.ones(1, dtype=torch.float32, device=qkv.device)

        def call():
            v.ops.rotary_embedding(pos, q, k, q.shape[-1], cos_sin, True)
            v.cache_ops.reshape_and_cache(k, val, kc, vc, slots, "auto", one, one)
            return kc, vc, q

        return PeerCall(call, reset=reset)

    return {"vllm rotary_embedding + reshape_and_cache (in place on qkv's views)": vllm_chain}


# ------------------------------------------------------------------------------------------------
# Chapter 10: sampling. top_k_mask_logits: inputs [logits f32 [B, V], top_k int32 [B]] -> masked
# logits f32 [B, V]; top_k_renorm_probs: [probs f32 [B, V], top_k int32 [B]] -> renormalized
# probs; top_p_renorm_probs: [probs, top_p f32 [B]] -> renormalized probs; sample: [logits,
# temperature f32 [B], top_k int32 [B], top_p f32 [B], min_p f32 [B], seed_offset int64 [2]] ->
# tokens int32 [B]; rejection_sample: [draft_probs f32 [B, S, V], draft_tokens int32 [B, S],
# target_probs f32 [B, S + 1, V], seed_offset] -> tokens int32 [B, S + 1], num_accepted int32 [B].
# vLLM has no kernel of these forms in its _C: its sampler filters in torch (a sort and a gather,
# or torch.topk) and hands the filtering and sampling to FlashInfer where installed (its rejection
# sampler is Triton, outside the kit), so FlashInfer's kernels are the production peers and vLLM
# has none here.

SAMPLE_FILTERS = ("top_k", "top_p", "min_p")


def _flashinfer_sampling(name: str):
    """FlashInfer's sampling.<name>, or Absent (no FlashInfer, a FlashInfer without that function,
    or, with the kit, no prebuilt "sampling" module), before any input is touched."""
    fn = getattr(library("flashinfer").sampling, name, None)
    if fn is None:
        raise Absent(f"{status_of('flashinfer')} has no sampling.{name}")
    _flashinfer_prebuilt("sampling")
    return fn


def _seed_offset(seed_offset) -> dict:
    """FlashInfer's seed and offset as int64 tensors of one element, views of the op's seed_offset:
    tensors, not Python ints, because FlashInfer reads them on the device, so a CUDA graph replays
    them (FlashInfer's own advice) and no host value is read between launches."""
    return {"seed": seed_offset[:1], "offset": seed_offset[1:]}


def sampling_peers(op: str, filters: Sequence[str] = ()) -> dict[str, Callable]:
    """FlashInfer's kernel(s) for one of chapter 10's ops, each row's parameters the op's [B]
    tensors (a Python number would be one value for every row, and changes some paths).

    - top_k_mask_logits(logits, top_k), top_k_renorm_probs(probs, top_k) -> a new [B, V] tensor:
      both radix-select the k-th value of each row (one or several CTAs a row) and keep every
      token >= it, ties included, as the contract does; k >= V keeps the row (the renormalization
      still divides by its sum); FlashInfer asks for k in (0, V), which the bench's k are. The
      renormalization multiplies by an approximate reciprocal of a float32 sum: far inside 2^-14.
      A 1 MB row-state buffer is allocated and zeroed on the first call, which is the bench's
      untimed verifying call.
    - top_p_renorm_probs(probs, top_p): AIR top-p (radix passes over the probs for the threshold,
      no sort); it allocates its workspace on every call, which is timed with it.
    - sample, by the case's `filters` (those of SAMPLE_FILTERS on in its rows): top-k and top-p:
      top_k_top_p_sampling_from_logits(logits / T, top_k, top_p, filter_apply_order=
      "top_k_first"), which with a per-row top_k tensor masks the logits (top_k_mask_logits), takes
      torch.softmax and samples by top-p rejection (an int k <= 256 would take another path, a
      radix top-k first); top-p, top-k or min-p alone: top_p_sampling_from_probs,
      top_k_sampling_from_probs or min_p_sampling_from_probs of FlashInfer's softmax(logits,
      temperature=T) (its fused online softmax; the softmax is timed with the sampling); no filter:
      sampling_from_logits(logits / T) and sampling_from_probs of that softmax. The division by T
      is torch's, timed with the call. Any other combination (min-p with another filter) has no
      FlashInfer kernel: none. The sampling kernels draw from curand's Philox with the op's
      seed_offset (_seed_offset), but consume it in their own order: their tokens are checked for
      admissibility only (lkw.bench's check), never against ours.
    - rejection_sample: chain_speculative_sampling(draft_probs, draft_tokens, target_probs) ->
      (tokens [B, S + 1] with -1 after the emitted tokens, the op's layout; accepted [B], the
      drafts that WOULD pass each judged alone, not ours; emitted [B], the drafts accepted before
      the first rejection, which is our num_accepted): the peer returns (tokens, emitted). The two
      counters are allocated zeroed by FlashInfer on every call (it adds to them), timed with it.

    Every one comes from FlashInfer's "sampling" module, which the peer kit prebuilds."""
    if set(filters) - set(SAMPLE_FILTERS):
        raise ValueError(f"filters must be among {SAMPLE_FILTERS}, got {tuple(filters)}")
    filters = tuple(f for f in SAMPLE_FILTERS if f in filters)  # the table's order

    def renorm(torch, ins):
        fn = _flashinfer_sampling(op)
        x, param = ins
        return PeerCall(lambda: (fn(x, param),))

    def top_k_top_p(torch, ins):
        fn = _flashinfer_sampling("top_k_top_p_sampling_from_logits")
        x, t, top_k, top_p, _, seed_offset = ins
        seeds = _seed_offset(seed_offset)
        return PeerCall(lambda: (fn(x / t[:, None], top_k, top_p, filter_apply_order="top_k_first", **seeds),))

    def from_probs(name: str, param: int | None):
        """name(softmax(logits, temperature=T), the op's input `param` where given)."""

        def factory(torch, ins):
            fn, softmax = _flashinfer_sampling(name), _flashinfer_sampling("softmax")
            x, t, seed_offset = ins[0], ins[1], ins[5]
            args = () if param is None else (ins[param],)
            seeds = _seed_offset(seed_offset)
            return PeerCall(lambda: (fn(softmax(x, temperature=t), *args, **seeds),))

        return factory

    def from_logits(torch, ins):
        fn = _flashinfer_sampling("sampling_from_logits")
        x, t, seed_offset = ins[0], ins[1], ins[5]
        seeds = _seed_offset(seed_offset)
        return PeerCall(lambda: (fn(x / t[:, None], **seeds),))

    def chain(torch, ins):
        fn = _flashinfer_sampling("chain_speculative_sampling")
        q, drafts, p, seed_offset = ins
        seeds = _seed_offset(seed_offset)

        def call():
            tokens, _accepted_alone, emitted = fn(q, drafts, p, **seeds)
            return tokens, emitted

        return PeerCall(call)

    if op in ("top_k_mask_logits", "top_k_renorm_probs", "top_p_renorm_probs"):
        return {f"flashinfer {op}": renorm}
    if op == "rejection_sample":
        return {"flashinfer chain_speculative_sampling": chain}
    if op != "sample":
        return {}
    table = {
        ("top_k", "top_p"): {"flashinfer top_k_top_p_sampling_from_logits": top_k_top_p},
        ("top_p",): {"flashinfer softmax + top_p_sampling_from_probs": from_probs("top_p_sampling_from_probs", 3)},
        ("top_k",): {"flashinfer softmax + top_k_sampling_from_probs": from_probs("top_k_sampling_from_probs", 2)},
        ("min_p",): {"flashinfer softmax + min_p_sampling_from_probs": from_probs("min_p_sampling_from_probs", 4)},
        (): {"flashinfer sampling_from_logits": from_logits,
             "flashinfer softmax + sampling_from_probs": from_probs("sampling_from_probs", None)},
    }
    return table.get(filters, {})
