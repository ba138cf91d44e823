"""tcgemv_glu's launch plan without a GPU: which shapes get a fused gate / up launch, in how many K
splits (one, or a cluster: never global partials), and the instances a model's warmup compiles."""
from minferd.kernels import part, parts, tcgemv, tcgemv_glu as tg
from minferd.kernels.quant import TYPES

SMS = 132  # an H100 SXM's / H200's SMs

Q4K, Q6K, Q5_0, Q3K = TYPES["Q4_K"], TYPES["Q6_K"], TYPES["Q5_0"], TYPES["Q3_K"]


def test_the_7b_gate_up_is_one_split_the_8b_and_05b_a_cluster():
    """The fused launch's split count is the unfused group's (tcgemv_g / tcgemv_cl over both
    matrices' row tiles) at the 7B's, 8B's and 0.5B's gate / up shapes, 16 tokens."""
    for qt, N, K, want in ((Q4K, 18944, 3584, 1), (Q4K, 14336, 4096, 2), (Q5_0, 4864, 896, 4)):
        group = tcgemv.splits(qt, N, K // qt.block_elems, 16, SMS, tiles=2 * -(-N // tcgemv.rows_per_cta(16, qt)))
        assert tg.fused_splits(qt, N, K, 16, SMS) == group == want, (qt.name, N, K)


def test_no_fused_launch_where_it_would_need_partials_or_has_no_kernel():
    assert tg.fused_splits(Q4K, 18944, 3584, 33, SMS) is None  # past 32 tokens
    assert tg.fused_splits(Q6K, 3584, 18944, 16, SMS) is None  # K past 8192 splits into partials
    assert tg.fused_splits(Q3K, 18944, 3584, 16, SMS) is None  # no tcgemv decoder
    assert tg.fused_splits(Q4K, 18944, 3600, 16, SMS) is None  # K no whole number of blocks


def test_every_type_has_one_split_and_cluster_instances_in_its_own_part():
    names = tg.names()
    assert len(parts(names)) - 1 == len(tcgemv.SUPPORTED)
    for t in tcgemv.SUPPORTED:
        for M in (3, 16, 32):
            for s in (1,) + tcgemv.CLUSTERS:
                name = tg.kernel_name(TYPES[t], M, cluster=s)
                assert name in names and name in part(names, name)
    assert tg.kernel_name(Q4K, 16) == "tcgemv_glu<12, 2, 1, 4, 1>"
    assert tg.rows_per_cta(16, Q4K) == 32
