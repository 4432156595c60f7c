"""Embeddings: Engine.encode and /v1/embeddings against transformers on the same tiny checkpoint.

The checkpoint is the tiny Qwen2 with a sentence-transformers pooling config beside it (last
token, normalized, as gte-Qwen2 ships; and mean pooling). The reference is transformers' own
Qwen2Model: its last hidden state (after the final norm), pooled and normalized the same way.
"""

import json
import shutil

import openai
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModel, AutoTokenizer

from minisgl.entrypoints.engine import Engine
from minisgl.entrypoints.http_server import create_app
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs
from tests._models import tiny_model_dir

SENTENCES = ["The river rose after the storm.", "A serving engine batches requests.", "Rain swelled the stream."]


def _embedding_checkpoint(tmp_path, pooling: str):
    out = tmp_path / f"tiny-embed-{pooling}"
    shutil.copytree(tiny_model_dir("qwen2"), out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir()
    keys = {"last": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens"}
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, keys[pooling]: True}))
    return str(out)


def _reference(path: str, pooling: str) -> torch.Tensor:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for s in SENTENCES:
            hidden = model(torch.tensor([tok.encode(s)])).last_hidden_state[0]
            pooled = hidden[-1] if pooling == "last" else hidden.mean(0)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.stack(rows)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_engine_encode_matches_transformers(tmp_path, pooling):
    path = _embedding_checkpoint(tmp_path, pooling)
    with Engine(model_path=path, is_embedding=True, max_total_tokens=512) as engine:
        got = torch.tensor([r["embedding"] for r in engine.encode(SENTENCES)])
        one = engine.encode(SENTENCES[0])
    expected = _reference(path, pooling)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert one["embedding"] == pytest.approx(got[0].tolist(), abs=1e-6)
    assert one["meta_info"]["prompt_tokens"] > 0 and one["meta_info"]["completion_tokens"] == 0
    # Sensible on a fixed set: unit vectors, a sentence closest to itself.
    sims = got @ got.T
    torch.testing.assert_close(sims.diagonal(), torch.ones(3), atol=1e-5, rtol=0)
    assert (sims.argmax(dim=1) == torch.arange(3)).all()


def test_v1_embeddings_openai_shape(tmp_path):
    path = _embedding_checkpoint(tmp_path, "last")
    tm = TokenizerManager(ServerArgs(model_path=path, is_embedding=True, max_total_tokens=512), threaded=True)
    try:
        client = openai.OpenAI(
            base_url="http://testserver/v1", api_key="-", http_client=TestClient(create_app(tm, "e"))
        )
        r = client.embeddings.create(model="e", input=SENTENCES)
        assert [d.index for d in r.data] == [0, 1, 2] and r.object == "list" and r.model == "e"
        got = torch.tensor([d.embedding for d in r.data])
        torch.testing.assert_close(got, _reference(path, "last"), atol=1e-4, rtol=0)
        assert r.usage.prompt_tokens == r.usage.total_tokens > 0
        ids = tm.tokenizer.encode(SENTENCES[1])
        by_ids = client.embeddings.create(model="e", input=ids)
        assert by_ids.data[0].embedding == pytest.approx(r.data[1].embedding, abs=1e-6)
        with pytest.raises(openai.BadRequestError, match="dimensions"):
            client.embeddings.create(model="e", input="x", dimensions=8)
        # Any model name, as SGLang serves it; a LoRA adapter's "base:adapter" is refused by name.
        assert client.embeddings.create(model="default", input=ids).data[0].embedding == by_ids.data[0].embedding
        with pytest.raises(openai.BadRequestError, match="LoRA"):
            client.embeddings.create(model="e:adapter", input="x")
        # The client asks for base64 (float32 bytes) unless told otherwise: both must agree.
        floats = client.embeddings.create(model="e", input=SENTENCES, encoding_format="float")
        torch.testing.assert_close(torch.tensor([d.embedding for d in floats.data]), got, atol=1e-7, rtol=0)
    finally:
        tm.shutdown()


def test_embeddings_need_is_embedding(tiny_llama):
    with Engine(model_path=tiny_llama, max_total_tokens=256) as engine:
        with pytest.raises(ValueError, match="--is-embedding"):
            engine.encode("hello")
