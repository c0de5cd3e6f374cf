"""Reference rows of the fused ops: each runs the chain its `replaces` spells, link after link, with
libref's own rows, so a fused row of any library can be checked against exactly the chain it
stands for. A link's parameters are the fused op's: `p.i` where the op names link i's own, else `p`."""

from radiance.abi import RAD_OK, RadArgs

from . import attention, collective, dense, sample
from .vocabulary import SCHEMAS

LINK_ROWS = {"embedding": dense.embedding, "rmsnorm": dense.rmsnorm, "gemm": dense.gemm, "rope": attention.rope,
             "attention": attention.attention, "sliding_attention": attention.sliding_attention, "add": dense.add,
             "silu_mul": dense.silu_mul, "gelu_tanh_mul": dense.gelu_tanh_mul, "rmsnorm_heads": dense.rmsnorm_heads,
             "scale": dense.scale, "take_rows": dense.take_rows, "all_reduce": collective.all_reduce,
             "sample": sample.sample}
SCHEMA = {schema.op: schema for schema in SCHEMAS}

# the chains, spelled with each fused op's operands (docs/OPS.md)
REPLACES = {
    "all_reduce_add_rmsnorm": "all_reduce(x)+add(residual,x,residual)+rmsnorm(residual,w,y)",
    "add_rmsnorm": "add(residual,x,residual)+rmsnorm(residual,w,y)",
    "rmsnorm_gemm3": "rmsnorm(x,norm,normed)+gemm(normed,wq,q)+gemm(normed,wk,k)+gemm(normed,wv,v)",
    "rmsnorm_gemm2": "rmsnorm(x,norm,normed)+gemm(normed,wq,q)+gemm(normed,wk,k)",
    "rmsnorm_gemm2_silu_mul": "rmsnorm(x,norm,normed)+gemm(normed,wg,gate)+gemm(normed,wu,up)+silu_mul(gate,up,gate)",
    "add_rmsnorm_gemm3": "add(residual,x,residual)+rmsnorm(residual,norm,normed)"
                         "+gemm(normed,wq,q)+gemm(normed,wk,k)+gemm(normed,wv,v)",
    "add_rmsnorm_gemm2_silu_mul": "add(residual,x,residual)+rmsnorm(residual,norm,normed)"
                                  "+gemm(normed,wg,gate)+gemm(normed,wu,up)+silu_mul(gate,up,gate)",
    "gemm_add": "gemm(x,w,y)+add(residual,y,residual)",
    "rope_attention": "rope(q,k,positions,inv_freq)+attention(q,k,v,k_cache,v_cache,slots,positions,cu_seqlens,"
                      "context_lens,block_tables,out)",
    "take_rows_rmsnorm_gemm_sample": "take_rows(h,index,rows)+rmsnorm(rows,norm,normed)+gemm(normed,w,logits)"
                                     "+sample(logits,temperature,top_k,top_p,rng,tokens)",
}


def _links(text: str) -> list[tuple[str, list[str]]]:
    links = []
    for link in text.split("+"):
        op, names = link[:-1].split("(")
        links.append((op, names.split(",")))
    return links


def chain_row(op: str):
    """The launch of fused op `op`: its chain's libref rows, in order, over the fused operands."""
    names = [operand.name for operand in SCHEMA[op].operands]
    links = _links(REPLACES[op])

    def launch(a):
        operands = dict(zip(names, a.t))
        for i, (link, slots) in enumerate(links):
            params = {p.name: a.params[f"{p.name}.{i}"] if f"{p.name}.{i}" in a.params else a.params.get(p.name)
                      for p in SCHEMA[link].params}
            status = LINK_ROWS[link](RadArgs(t=tuple(operands[name] for name in slots), params=params, peers=a.peers))
            if status != RAD_OK:
                return status
        return RAD_OK
    launch.__name__ = f"ref_{op}"
    return launch
