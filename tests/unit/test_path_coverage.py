"""The planner's type coverage per path comes from the kernels themselves: a model with no type
the MMQ kernel covers goes FUSED_B; one with some keeps MMQ (the rest on fused_b / tiles)."""
from minferd.devices import MatmulPath, cuda_traits
from minferd.kernels import gemm_f16, mmq
from minferd.kernels.quant import CUDA_TYPES
from minferd.pool.estimator import estimate
from minferd.pool.planner import plan


def test_cuda_coverage_is_the_kernels_own():
    t = cuda_traits()
    assert t.path_types[MatmulPath.MMQ] == mmq.SUPPORTED
    assert t.path_types[MatmulPath.FUSED_B] == gemm_f16.SUPPORTED == frozenset(CUDA_TYPES)
    assert t.path_types[MatmulPath.W16] == frozenset(CUDA_TYPES)
    assert "F16" not in mmq.SUPPORTED and "Q4_K" in mmq.SUPPORTED


def test_type_without_mmq_kernel_goes_fused_b(synth_model):
    from minferd.model.loader import open_model_file
    traits = cuda_traits()
    for quant, want in (("q4_k", MatmulPath.MMQ), ("f16", MatmulPath.FUSED_B)):
        mf = open_model_file(synth_model("llama", quant))
        p = plan(estimate(mf, traits, 256), traits, free=1 << 40)
        assert p.matmul_path == want, (quant, p.reason)
