"""A trainable EAGLE / EAGLE3 draft head in plain torch, and its checkpoint in SGLang's format.

The head is the one SGLang serves (models/llama_eagle.py, models/llama_eagle3.py), written
for training instead of serving: no paged KV cache, no ForwardBatch, whole sequences at once.
``unroll`` runs the head the way decoding does, k draft steps in a chain, each step reading
the previous step's output as its feature, over every position of a sequence in parallel
(EAGLE-3's "training-time test"). The attention mask makes each step see exactly what it
sees at decode time: the keys the draft wrote from the target's features at positions
<= i (draft_extend), plus the keys of its own earlier chain steps at positions i+1..i+s.

The bricks (RMSNorm, MLP, rotary embedding) are transformers' Llama ones, so the trained
weights mean what the serving models expect and the rope matches the target's config.
The target's embedding (and, for EAGLE, its LM head) are frozen buffers shared with the
target, as SGLang's worker shares them (set_embed_and_head); they are not saved.
"""

from __future__ import annotations

import json
import pathlib

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

ALGORITHMS = ("EAGLE", "EAGLE3")


class DraftAttention(nn.Module):
    """Self-attention of the draft layer over a chain of draft steps (q/k/v/o as in SGLang's LlamaAttention).

    Step 0's keys cover every position causally; each later step s adds one key per
    position (its own, and those of steps 1..s-1 at the same index), a diagonal.
    """

    def __init__(self, config: LlamaConfig, in_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_proj = nn.Linear(in_dim, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos_sin: tuple, cache: list[tuple[torch.Tensor, torch.Tensor]]):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # [b, heads, n, d]
        k = self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *cos_sin)
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        steps = cache + [(k, v)]
        scale = self.head_dim**-0.5
        k0, v0 = steps[0]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        scores = (q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [b, heads, n, n]
        diagonal = [(q * kt).sum(-1, keepdim=True) * scale for kt, _ in steps[1:]]  # each [b, heads, n, 1]
        probs = torch.cat([scores, *diagonal], dim=-1).softmax(-1)
        out = probs[..., :n] @ v0
        for t, (_, vt) in enumerate(steps[1:]):
            out = out + probs[..., n + t : n + t + 1] * vt
        out = out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)
        return self.o_proj(out), (k, v)


class DraftDecoderLayer(nn.Module):
    """The head's one decoder layer: EAGLE's ``layers.0`` or EAGLE3's ``midlayer``.

    EAGLE's layer 0 has no input_layernorm (the fc output goes straight to attention);
    EAGLE3's attends over cat(input_layernorm(embed), hidden_norm(feature)), width 2H.
    """

    def __init__(self, config: LlamaConfig, eagle3: bool):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.eagle3 = eagle3
        if eagle3:
            self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
            self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.self_attn = DraftAttention(config, 2 * hidden if eagle3 else hidden)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.mlp = LlamaMLP(config)

    def forward(self, embeds, hidden, cos_sin, cache):
        residual = hidden
        if self.eagle3:
            hidden = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden, kv = self.self_attn(hidden, cos_sin, cache)
        residual = hidden + residual
        hidden = self.mlp(self.post_attention_layernorm(residual))
        return hidden + residual, kv  # SGLang's fused "hidden + residual"


class EagleHead(nn.Module):
    """SGLang's LlamaForCausalLMEagle / LlamaForCausalLMEagle3 as one trainable module.

    ``hot_ids`` [N] are the target token ids the head can draft (sorted): EAGLE's
    --speculative-token-map, EAGLE3's draft vocabulary (d2t/t2d).
    """

    def __init__(self, config: LlamaConfig, algorithm: str, embed: torch.Tensor, lm_head: torch.Tensor, hot_ids):
        super().__init__()
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        self.config, self.algorithm = config, algorithm
        self.eagle3 = algorithm == "EAGLE3"
        hidden = config.hidden_size
        self.register_buffer("embed", embed.detach().float(), persistent=False)
        self.register_buffer("hot_ids", hot_ids.long(), persistent=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        head = lm_head.detach().float()[self.hot_ids]  # [N, H], the target's rows for the hot tokens
        if self.eagle3:
            self.fc = nn.Linear(3 * hidden, hidden, bias=False)
            self.midlayer = DraftDecoderLayer(config, eagle3=True)
            self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
            # EAGLE3 owns its LM head; starting from the target's rows, it starts where the target is.
            self.lm_head = nn.Linear(hidden, len(hot_ids), bias=False)
            self.lm_head.weight.data.copy_(head)
        else:
            self.fc = nn.Linear(2 * hidden, hidden, bias=True)
            self.layers = nn.ModuleList([DraftDecoderLayer(config, eagle3=False)])
            self.register_buffer("hot_lm_head", head, persistent=False)

    def step(self, tokens, feature, positions, cache):
        """One draft step at every position: (logits over the hot ids, the next step's feature, this step's k/v)."""
        embeds = self.embed[tokens]
        cos_sin = self.rotary_emb(embeds, positions)
        if self.eagle3:
            if feature.shape[-1] != embeds.shape[-1]:
                feature = self.fc(feature)  # the target's three captured layers, 3H -> H
            out, kv = self.midlayer(embeds, feature, cos_sin, cache)
            return self.lm_head(self.norm(out)), out, kv
        hidden = self.fc(torch.cat([embeds, feature], dim=-1))
        out, kv = self.layers[0](embeds, hidden, cos_sin, cache)
        return out @ self.hot_lm_head.T, out, kv

    def unroll(self, tokens: torch.Tensor, first_feature: torch.Tensor, num_steps: int):
        """Chain of num_steps drafts from every position i < n = first_feature.shape[1].

        tokens [b, >= n + num_steps]: step s at index i reads tokens[:, i + s + 1] (the token it
        would have drafted, if the chain is still alive) at position i + s. Returns per step
        (logits [b, n, N], output feature [b, n, H]); step s predicts the token at i + s + 2.
        """
        n = first_feature.shape[1]
        feature, cache, results = first_feature, [], []
        for s in range(num_steps):
            positions = (torch.arange(n, device=tokens.device) + s).expand(tokens.shape[0], n)
            logits, feature, kv = self.step(tokens[:, s + 1 : s + 1 + n], feature, positions, cache)
            cache.append(kv)
            results.append((logits, feature))
        return results

    def save(self, out_dir: pathlib.Path, target_config: dict, dtype: torch.dtype, aux_layers=None) -> list[str]:
        """Write config.json + model.safetensors (+ EAGLE's hot_token_map.pt); returns the files written."""
        out_dir.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        config = {
            k: v for k, v in target_config.items() if k not in ("architectures", "auto_map", "quantization_config")
        }
        name = str(dtype).removeprefix("torch.")
        config.update(num_hidden_layers=1, tie_word_embeddings=False, torch_dtype=name, dtype=name)
        config["rope_theta"] = self.config.rope_parameters["rope_theta"]  # SGLang reads the flat key
        files = ["config.json", "model.safetensors"]
        if self.eagle3:
            config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=len(self.hot_ids))
            # The layers the head was trained on, in SGLang's key (the worker reads them from here).
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_layers}
            tensors["d2t"] = self.hot_ids - torch.arange(len(self.hot_ids))  # draft index i -> token i + d2t[i]
            t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool)
            t2d[self.hot_ids] = True
            tensors["t2d"] = t2d
        else:
            config.update(architectures=["LlamaForCausalLMEagle"])
            torch.save(self.hot_ids.clone(), out_dir / "hot_token_map.pt")
            files.append("hot_token_map.pt")
        save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return files
