"""The rows of the benchmark: what is timed against what, at which size.

Ours are ``sf.optimize``d (the speed paths of scratchformer.fast, as the tasks use them). Every
model has random weights (no download) and dropout 0 (the references and ours then do the
same arithmetic; dropout would time the random-number generator, not the model). Inference runs
under ``torch.inference_mode()`` (which also lets ``torch.nn``'s fast path engage).

Every row runs in the precision it is built for (``--precision``): in fp32; or in bf16, where the
inference models (ours and the references alike) are cast to bf16, and a training step runs
under bf16 autocast with fp32 weights, as the recipes train. Every optimizer is torch's fused
AdamW where the device has it (our Trainer's choice, and Hugging Face Trainer's default).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

import scratchformer as sf
from benchmarks.harness import Case, Group
from scratchformer.generation import beam_search
from scratchformer.generation.fast_beam import fast_beam_search
from scratchformer.training.optimizer import FUSED_ADAMW_DEVICES

FAST, SLOW = "torch.nn fast path", "torch.nn fast path off"
OURS, OURS_SKIP = "scratchformer Encoder", "scratchformer Encoder, skip_padding"
OURS_BERT, OURS_BERT_SKIP = "scratchformer ContextualEncoder", "scratchformer ContextualEncoder, skip_padding"
BERT = "transformers BertModel"
GROUPS = ("peak", "gpt2", "inference", "training", "seq2seq", "decoding", "precision", "compile")  # run order
PRECISIONS = ("fp32", "bf16")
ONCE = ("peak", "precision", "gpt2")  # groups that set their own precision (run once, not per precision)


@dataclass
class Size:
    """Model and batch sizes of one run of the suite."""

    d_model: int
    heads: int
    d_ff: int
    layers: int
    vocab: int
    shapes: tuple[tuple[int, int], ...]  # encoder inference (B, T)
    train: tuple[int, int]  # encoder training step (B, T)
    seq2seq: tuple[int, int]  # encoder-decoder training step (B, S = T)
    decode_batches: tuple[int, ...]
    new_tokens: int
    src_len: int
    matmul_n: int
    repeats: int
    latency_repeats: int
    gpt: tuple[int, int, int, int, int, int]  # D, layers, heads, T, B, vocab


SIZES = {
    "full": Size(
        512,
        8,
        2048,
        6,
        8000,
        ((32, 128), (8, 512), (1, 32)),
        (16, 128),
        (16, 64),
        (8, 32),
        64,
        24,
        2048,
        5,
        30,
        (768, 12, 12, 1024, 8, 50304),
    ),
    "smoke": Size(
        32,
        4,
        64,
        2,
        100,
        ((4, 16), (2, 32), (1, 8)),
        (2, 16),
        (2, 8),
        (2,),
        4,
        6,
        128,
        2,
        2,
        (32, 2, 4, 32, 2, 128),
    ),
}


def padded_lengths(B: int, T: int, padding: float, seed: int = 0) -> list[int]:
    """B lengths spread evenly from T down to T * (1 - 2 * padding) (mean T * (1 - padding)), shuffled."""
    lengths = [T - round(2 * padding * T * (i + 0.5) / B) for i in range(B)]
    order = torch.randperm(B, generator=torch.Generator().manual_seed(seed)).tolist()
    return [lengths[i] for i in order]


def real_mask(lengths: list[int], T: int, device: torch.device) -> Tensor:
    """(B, T) bool, True at the first ``lengths[b]`` positions of row b."""
    return torch.arange(T, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]


def linear_params(size: Size, decoder: bool = False) -> int:
    """Weights of the linear maps of one stack: Q, K, V, O (and cross-attention's four) and the FFN."""
    attention = (8 if decoder else 4) * size.d_model**2
    return size.layers * (attention + 2 * size.d_model * size.d_ff)


def encoder_flops(size: Size, lengths: list[int]) -> float:
    """2 x params x tokens for the linear maps + 4 x L^2 x D per layer and sequence for attention."""
    return 2.0 * linear_params(size) * sum(lengths) + 4.0 * size.d_model * size.layers * sum(
        n * n for n in lengths
    )


@contextlib.contextmanager
def fast_path(enabled: bool) -> Iterator[None]:
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


def inference(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with torch.inference_mode():
            return fn()

    return run


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager[object]:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


class Models:
    """The encoders being compared, built once (same sizes; random weights)."""

    def __init__(self, size: Size, device: torch.device):
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        D, H, F, N = size.d_model, size.heads, size.d_ff, size.layers
        self.ours = sf.optimize(
            sf.Encoder([sf.EncoderLayer(D, H, F, dropout=0.0) for _ in range(N)]).to(device)
        )
        layer = nn.TransformerEncoderLayer(D, H, F, dropout=0.0, batch_first=True)
        self.torch = nn.TransformerEncoder(layer, N, enable_nested_tensor=True).to(device)
        max_len = max(max(T for _, T in size.shapes), size.train[1])
        self.ours_bert = sf.optimize(
            sf.ContextualEncoder(
                sf.EncoderConfig(
                    vocab_size=size.vocab,
                    d_model=D,
                    num_heads=H,
                    num_layers=N,
                    d_ff=F,
                    dropout=0.0,
                    activation="gelu",
                    layer_norm_eps=1e-12,
                    max_len=max_len,
                    positional="learned",
                    type_vocab_size=2,
                    embedding_norm=True,
                    scale_embedding=False,
                    pad_id=0,
                )
            ).to(device)
        )
        # the same weights, computing real tokens only (sf.optimize(..., skip_padding=True))
        self.ours_skip = sf.optimize(copy.deepcopy(self.ours), skip_padding=True)
        self.ours_bert_skip = sf.optimize(copy.deepcopy(self.ours_bert), skip_padding=True)
        self.bert: nn.Module = BertModel(
            BertConfig(
                vocab_size=size.vocab,
                hidden_size=D,
                num_hidden_layers=N,
                num_attention_heads=H,
                intermediate_size=F,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                max_position_embeddings=max_len,
            ),
            add_pooling_layer=False,
        )
        nn.Module.to(self.bert, device)

    def all(self) -> list[nn.Module]:
        return [self.ours, self.ours_skip, self.torch, self.ours_bert, self.ours_bert_skip, self.bert]


def dtype_of(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16" else torch.float32


def inference_groups(size: Size, device: torch.device, precision: str) -> list[Group]:
    """Encoder inference, each shape without and with 25% padding (models cast to the precision)."""
    models = Models(size, device)
    dtype = dtype_of(precision)
    for m in models.all():
        m.eval().to(dtype)
    groups = []
    for B, T in size.shapes:
        for padding in (0.0, 0.25):
            lengths = padded_lengths(B, T, padding) if padding else [T] * B
            mask = real_mask(lengths, T, device)
            x = torch.randn(B, T, size.d_model, device=device, dtype=dtype)
            tokens = torch.randint(1, size.vocab, (B, T), device=device).masked_fill(~mask, 0)
            row = f"B{B}xT{T}" + (", 25% padding" if padding else "")
            n, flops = sum(lengths), encoder_flops(size, lengths)
            kpm = mask if padding else None
            torch_kpm = ~mask if padding else None  # torch.nn's polarity: True = padding

            def run_torch(enabled: bool, torch_kpm: Tensor | None = torch_kpm, x: Tensor = x) -> object:
                with fast_path(enabled):
                    return models.torch(x, src_key_padding_mask=torch_kpm)

            def case(
                impl: str,
                fn: Callable[[], object],
                refs: tuple[str, ...] = (),
                row: str = row,
                n: int = n,
                flops: float = flops,
            ) -> Case:
                return Case(row, impl, inference(fn), n, flops, refs, precision)

            cases = [
                case(OURS, partial(models.ours, x, kpm), (FAST, SLOW)),
                case(FAST, partial(run_torch, True)),
                case(SLOW, partial(run_torch, False)),
                case(OURS_BERT, partial(models.ours_bert, tokens, mask), (BERT,)),
                case(BERT, partial(models.bert, input_ids=tokens, attention_mask=mask.long())),
            ]
            if padding:
                cases.insert(1, case(OURS_SKIP, partial(models.ours_skip, x, kpm), (FAST, SLOW, OURS)))
                cases.insert(
                    5, case(OURS_BERT_SKIP, partial(models.ours_bert_skip, tokens, mask), (BERT, OURS_BERT))
                )
            repeats = size.latency_repeats if B * T <= 64 else size.repeats
            groups.append(Group(f"encoder inference {row}", cases, repeats, precision=precision))
    return groups


def _train_step(
    model: nn.Module, forward: Callable[[], Tensor], device: torch.device, precision: str
) -> Callable[[], object]:
    """One step: forward (under bf16 autocast for "bf16"), a scalar loss, backward, fused AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type in FUSED_ADAMW_DEVICES)

    def step() -> object:
        opt.zero_grad(set_to_none=True)
        with autocast(device, precision == "bf16"):
            loss = forward().float().square().mean()
        loss.backward()
        opt.step()
        return loss

    return step


def training_groups(size: Size, device: torch.device, precision: str) -> list[Group]:
    """Encoder training step (no padding), ours vs torch.nn and vs BertModel."""
    models = Models(size, device)
    for m in models.all():
        m.train()
    B, T = size.train
    x = torch.randn(B, T, size.d_model, device=device)
    tokens = torch.randint(1, size.vocab, (B, T), device=device)
    flops = 3 * encoder_flops(size, [T] * B)  # backward costs twice the forward
    row = f"B{B}xT{T}"
    cases = [
        Case(
            row,
            OURS,
            _train_step(models.ours, lambda: models.ours(x), device, precision),
            B * T,
            flops,
            ("torch.nn",),
            precision,
        ),
        Case(
            row,
            "torch.nn",
            _train_step(models.torch, lambda: models.torch(x), device, precision),
            B * T,
            flops,
            (),
            precision,
        ),
        Case(
            row,
            OURS_BERT,
            _train_step(models.ours_bert, lambda: models.ours_bert(tokens), device, precision),
            B * T,
            flops,
            (BERT,),
            precision,
        ),
        Case(
            row,
            BERT,
            _train_step(
                models.bert, lambda: models.bert(input_ids=tokens).last_hidden_state, device, precision
            ),
            B * T,
            flops,
            (),
            precision,
        ),
    ]
    return [
        Group("encoder training step (forward, backward, AdamW)", cases, size.repeats, precision=precision)
    ]


def seq2seq_group(size: Size, device: torch.device, precision: str) -> list[Group]:
    """Encoder-decoder training step, our stacks vs ``torch.nn.Transformer`` (embedded inputs)."""
    torch.manual_seed(0)
    D, H, F, N = size.d_model, size.heads, size.d_ff, size.layers
    encoder = sf.Encoder([sf.EncoderLayer(D, H, F, dropout=0.0) for _ in range(N)], sf.LayerNorm(D))
    decoder = sf.Decoder([sf.DecoderLayer(D, H, F, dropout=0.0) for _ in range(N)], sf.LayerNorm(D))
    ours = sf.optimize(nn.ModuleList([encoder, decoder]).to(device).train())
    ref = nn.Transformer(D, H, N, N, F, dropout=0.0, batch_first=True).to(device).train()
    B, L = size.seq2seq
    src = torch.randn(B, L, D, device=device)
    tgt = torch.randn(B, L, D, device=device)
    causal = nn.Transformer.generate_square_subsequent_mask(L, device=device)
    linear = linear_params(size) + linear_params(size, decoder=True)
    attention = 4.0 * D * N * B * (L * L + 2 * L * L)  # encoder self; decoder self and cross
    flops = 3 * (2.0 * linear * B * L + attention)
    row = f"6+6 layers, B{B}, S=T={L}" if N == 6 else f"{N}+{N} layers, B{B}, S=T={L}"
    cases = [
        Case(
            row,
            "scratchformer Encoder + Decoder",
            _train_step(ours, lambda: decoder(tgt, encoder(src)), device, precision),
            2 * B * L,
            flops,
            ("torch.nn.Transformer",),
            precision,
        ),
        Case(
            row,
            "torch.nn.Transformer",
            _train_step(ref, lambda: ref(src, tgt, tgt_mask=causal, tgt_is_causal=True), device, precision),
            2 * B * L,
            flops,
            (),
            precision,
        ),
    ]
    return [
        Group(
            "encoder-decoder training step (forward, backward, AdamW)",
            cases,
            size.repeats,
            note="tokens = source + target tokens",
            precision=precision,
        )
    ]


def decoding_groups(size: Size, device: torch.device, precision: str) -> list[Group]:
    """Greedy with the KV cache vs recomputing the prefix; beam 5 and top-p sampling vs greedy (exactly
    ``new_tokens`` each)."""
    torch.manual_seed(0)
    eos = 2
    cfg = sf.TransformerConfig(
        src_vocab_size=size.vocab,
        tgt_vocab_size=size.vocab,
        d_model=size.d_model,
        num_heads=size.heads,
        d_ff=size.d_ff,
        num_encoder_layers=size.layers,
        num_decoder_layers=size.layers,
        dropout=0.0,
        max_len=512,
    )
    model = sf.optimize(sf.Transformer(cfg).to(device).eval()).to(dtype_of(precision))
    with torch.no_grad():
        model.generator.bias[eos] = -1e4  # never finish early: every row generates exactly new_tokens
    groups = []
    for B in size.decode_batches:
        src = torch.randint(3, size.vocab, (B, size.src_len), device=device)

        def decode(
            use_cache: bool,
            beam: int = 0,
            steps: int = size.new_tokens,
            src: Tensor = src,
            top_p: float = 0.0,
            fast: bool = False,
        ) -> object:
            if top_p:
                config = sf.GenerationConfig(
                    decoder_start_token_id=1,
                    eos_token_id=eos,
                    do_sample=True,
                    top_p=top_p,
                    max_new_tokens=steps,
                )
                return sf.generate(model, src, config, seed=0)
            if beam:
                return (fast_beam_search if fast else beam_search)(
                    model, src, bos_id=1, eos_id=eos, beam_size=beam, max_len_a=0.0, max_len_b=steps
                )
            out = sf.greedy_decode(
                model, src, bos_id=1, eos_id=eos, use_cache=use_cache, max_len_a=0.0, max_len_b=steps
            )
            assert out.shape[1] == steps  # type: ignore[union-attr]
            return out

        row = f"batch {B}, {size.new_tokens} new tokens"
        n = B * size.new_tokens
        short = min(4, size.new_tokens)
        cases = [
            Case(
                row,
                "greedy, KV cache",
                partial(decode, True),
                n,
                references=("greedy, recompute prefix",),
                precision=precision,
                warmup_fn=partial(decode, True, steps=short),
            ),
            Case(
                row,
                "greedy, recompute prefix",
                partial(decode, False),
                n,
                precision=precision,
                warmup_fn=partial(decode, False, steps=short),
            ),
            Case(
                row,
                "beam 5, KV cache",
                partial(decode, True, beam=5),
                n,
                references=("greedy, KV cache",),
                precision=precision,
                warmup_fn=partial(decode, True, beam=5, steps=short),
            ),
            Case(
                row,
                "beam 5, fast (fast_beam_search)",
                partial(decode, True, beam=5, fast=True),
                n,
                references=("beam 5, KV cache",),
                precision=precision,
                warmup_fn=partial(decode, True, beam=5, steps=short, fast=True),
            ),
            Case(
                row,
                "top-p 0.9 sampling, KV cache",
                partial(decode, True, top_p=0.9),
                n,
                references=("greedy, KV cache",),
                precision=precision,
                warmup_fn=partial(decode, True, steps=short, top_p=0.9),
            ),
        ]
        groups.append(
            Group(
                f"decoding {row}",
                cases,
                size.repeats,
                precision=precision,
                note="tokens = new tokens of the batch (beam: of the best hypotheses)",
            )
        )
    return groups


def precision_group(size: Size, device: torch.device, precision: str = "") -> list[Group]:
    """Our encoder in bf16 autocast vs fp32 (inference, the first shape)."""
    models = Models(size, device)
    ours = models.ours.eval()
    B, T = size.shapes[0]
    x = torch.randn(B, T, size.d_model, device=device)
    flops = encoder_flops(size, [T] * B)

    def bf16() -> object:
        with autocast(device, True):
            return ours(x)

    cases = [
        Case(f"B{B}xT{T}", "scratchformer Encoder, fp32", inference(lambda: ours(x)), B * T, flops),
        Case(
            f"B{B}xT{T}",
            "scratchformer Encoder, bf16 autocast",
            inference(bf16),
            B * T,
            flops,
            ("scratchformer Encoder, fp32",),
            "bf16",
        ),
    ]
    return [Group("encoder inference, bf16 vs fp32", cases, size.repeats)]


def compile_group(size: Size, device: torch.device, precision: str) -> list[Group]:
    """``torch.compile`` of our encoder vs eager (inference, the first shape); the first call, which
    compiles, is timed on its own and reported in the group's note."""
    models = Models(size, device)
    ours = models.ours.eval().to(dtype_of(precision))
    compiled = torch.compile(ours)
    B, T = size.shapes[0]
    x = torch.randn(B, T, size.d_model, device=device, dtype=dtype_of(precision))
    flops = encoder_flops(size, [T] * B)
    start = time.perf_counter()
    inference(lambda: compiled(x))()
    compile_s = time.perf_counter() - start
    cases = [
        Case(
            f"B{B}xT{T}",
            "scratchformer Encoder, eager",
            inference(lambda: ours(x)),
            B * T,
            flops,
            (),
            precision,
        ),
        Case(
            f"B{B}xT{T}",
            "scratchformer Encoder, torch.compile",
            inference(lambda: compiled(x)),
            B * T,
            flops,
            ("scratchformer Encoder, eager",),
            precision,
        ),
    ]
    return [
        Group(
            "encoder inference, torch.compile vs eager",
            cases,
            size.repeats,
            precision=precision,
            note=f"the first call compiled in {compile_s:.1f} s (not in the timings)",
        )
    ]


class DecoderOnlyLM(nn.Module):
    """GPT-2-shaped decoder-only LM from our pieces: pre-LN ``EncoderLayer``s with a causal mask."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = sf.LearnedPositionalEmbedding(max_len, d_model)
        blocks = [
            sf.EncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, activation="gelu", norm_first=True)
            for _ in range(layers)
        ]
        self.blocks = sf.optimize(sf.Encoder(blocks, sf.LayerNorm(d_model)))

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, T) -> logits (B, T, V), the output projection tied to the embedding."""
        T = tokens.shape[1]
        h = self.blocks(self.position(self.embed(tokens)), attn_mask=sf.causal_mask(T, device=tokens.device))
        assert isinstance(h, Tensor)
        return h @ self.embed.weight.T


BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}


def gpu_peak_tflops(device: torch.device) -> float | None:
    """The card's dense bf16 peak from its data sheet (None: unknown card)."""
    name = torch.cuda.get_device_name(device)
    for key, peak in BF16_PEAK_TFLOPS.items():
        if key in name:
            return 756.0 if key == "H100" and "PCIe" in name else peak
    return None


def gpt2_group(size: Size, device: torch.device, precision: str = "") -> list[Group]:
    """GPT-2-small decoder-only training step (D=768, 12 layers, T=1024), bf16 autocast; CUDA only."""
    D, layers, heads, T, B, vocab = size.gpt
    torch.manual_seed(0)
    model = DecoderOnlyLM(vocab, D, layers, heads, T).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    tokens = torch.randint(0, vocab, (B, T + 1), device=device)

    def step() -> object:
        opt.zero_grad(set_to_none=True)
        with autocast(device, True):
            logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        return loss

    linear = layers * 12 * D * D + vocab * D  # the blocks' linear maps and the (tied) output projection
    flops = 3 * (2.0 * linear * B * T + 4.0 * T * T * D * layers * B)
    case = Case(
        f"D={D}, {layers} layers, T={T}, B={B}",
        "scratchformer decoder-only LM",
        step,
        B * T,
        flops,
        (),
        "bf16",
    )
    return [Group("GPT-2-small decoder-only training step, bf16", [case], size.repeats, warmup=2)]


def matmul_peak_group(size: Size, device: torch.device, precision: str = "") -> list[Group]:
    """Large square ``torch.matmul`` in fp32 and bf16: the machine's measured peak."""
    n = size.matmul_n if device.type == "cpu" else 8192
    a32 = torch.randn(n, n, device=device)
    b32 = torch.randn(n, n, device=device)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    flops = 2.0 * n**3
    cases = [
        Case(f"{n}x{n}x{n}", "torch.matmul fp32", lambda: torch.matmul(a32, b32), 0, flops, (), "fp32"),
        Case(f"{n}x{n}x{n}", "torch.matmul bf16", lambda: torch.matmul(a16, b16), 0, flops, (), "bf16"),
    ]
    return [Group("matmul peak", cases, max(size.repeats, 5))]


BUILDERS: dict[str, Callable[[Size, torch.device, str], list[Group]]] = {
    "peak": matmul_peak_group,
    "inference": inference_groups,
    "training": training_groups,
    "seq2seq": seq2seq_group,
    "decoding": decoding_groups,
    "precision": precision_group,
    "compile": compile_group,
    "gpt2": gpt2_group,
}
