"""Chapter 08 on the GPU: v5's pairs change where B comes from, not the sums.

At large M v5 runs blockwise tiles in clusters of two CTAs, one tile above the other, each loading
a slice of the shared B tile into both by TMA multicast. Every tile's sums are the same products
added in the same order as without the pairs, so v5_tuned and ablation_v5_no_multicast must give
the same bits, at a shape whose plan takes 192-wide tiles (which the golden cases, too small, never
reach) and at one with 128-wide tiles and an odd number of tile rows (the last pair's second CTA
past M). Both outputs start poisoned; the first is also checked against the bench's reference on
sampled rows.

Skipped, with the reason, without torch, a GPU or the compiled extension lkw._ext.
"""

import pytest

torch = pytest.importorskip("torch", reason="torch with CUDA launches the chapter 08 kernels")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: chapter 08's kernels run on the GPU", allow_module_level=True)
try:
    from lkw import _ext  # noqa: F401
except ImportError as e:
    pytest.skip(f"lkw._ext is not built ({e}): cmake --build build", allow_module_level=True)
if torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("v5 needs sm_90 (wgmma, TMA, clusters)", allow_module_level=True)
from lkw import bench  # noqa: E402


@pytest.mark.parametrize("m, n, k", [(2048, 4096, 1024), (640, 1000 // 16 * 16, 512)])
def test_pairs_give_the_bits_of_single_ctas(m, n, k):
    case = bench.fp8_gemm_case(m, n, k, "blockwise")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(m + n + k)
    typed_inputs, typed_outputs = case.make(torch, gen)
    inputs = bench._raw(typed_inputs)
    got = {}
    for version in ("v5_tuned", "ablation_v5_no_multicast"):
        outputs = [torch.empty_like(t) for t in bench._raw(typed_outputs)]
        bench._prime([(inputs, outputs)], None)
        bench.ext().launch(f"08_fp8_gemm/{case.op}/{version}", inputs, outputs, params=case.params, dtypes=case.dtypes)
        torch.cuda.synchronize()
        got[version] = outputs[0].clone()
    assert torch.equal(got["v5_tuned"], got["ablation_v5_no_multicast"])
    expected = bench._reference(case, [bench._host_bits(t) for t in inputs], [])
    check = bench._verify(case, inputs, [got["v5_tuned"]], expected)
    assert check["pass"], check["text"]
