"""The CUDA Q8_0 embedding gather (b12x_kernels.embedding_q8_0): one block per id, rows decoded to bf16."""

from __future__ import annotations

import torch

from .. import kernels
from .base import Backend, cuda_reason


class CudaEmbeddingQ8_0(Backend):
    name, op = "cuda_embedding_q8_0", "embedding"

    @classmethod
    def can_implement(cls, q):
        if q.format != "Q8_0":
            return False, f"runs Q8_0 tables, not {q.format}"
        why = cuda_reason(q)
        return (False, why) if why else (True, "CUDA Q8_0 row gather")

    def run(self, ids, *, config):
        emb = self.weights
        flat = ids.reshape(-1).contiguous()
        out = torch.empty(flat.numel(), emb.hidden, dtype=torch.bfloat16, device=ids.device)
        kernels.embedding_q8_0(
            emb.blocks.data_ptr(), flat.data_ptr(), flat.dtype == torch.int64, out.data_ptr(), flat.numel(), emb.vocab,
            emb.hidden, torch.cuda.current_stream(ids.device).cuda_stream,
        )  # fmt: skip
        return out
