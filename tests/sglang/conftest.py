"""Which of SGLang's vendored server tests minisgl skips, and why (nothing else is changed in them).

Every other test of the two files runs against a minisgl server on SmolLM2-135M-Instruct and must pass.
"""

import pytest

SMOLLM2_CONTEXT = "SmolLM2-135M's context is 8,192 tokens"
SKIPS: dict[str, str] = {
    # test_srt_endpoint.py
    "TestSRTEndpoint::test_cache_tokens": f"prompts of 10,000 and 11,000 tokens: {SMOLLM2_CONTEXT}",
    "TestSRTEndpoint::test_logprob_mixed": f"prompts of up to 50,000 tokens: {SMOLLM2_CONTEXT}",
    "TestSRTEndpoint::test_logprob_with_chunked_prefill": f"a prompt of about 72,000 tokens: {SMOLLM2_CONTEXT}",
    "TestSRTEndpoint::test_logit_bias": "token id 60704 is Llama-3.2's 'Paris'; SmolLM2's vocabulary has 49,152 ids",
    "TestSRTEndpoint::test_logit_bias_isolation": "token id 60704 is Llama-3.2's; SmolLM2's vocabulary has 49,152 ids",
    # test_openai_server.py
    "TestOpenAIServer::test_response_prefill": (
        "needs meta-llama/Llama-3.1-8B-Instruct and continue_final_message, which minisgl refuses"
    ),
    "TestOpenAIServerCustomLogitProcessor": (
        "compares text: ids 0-31 are ordinary tokens in Llama-3.2, but SmolLM2's 0-16 are special tokens, "
        "which the text leaves out (the /generate twin, TestSRTEndpoint::test_custom_logit_processor, checks ids)"
    ),
    "TestOpenAIServerv1Responses": "the OpenAI Responses API (/v1/responses) is not part of minisgl",
    "TestOpenAIV1Rerank": "rerank needs a cross-encoder model; minisgl serves generation models only",
    "TestOpenAIV1Score": "scoring (/v1/score) is not part of minisgl",
    "TestTokenizeDetokenize::test_detokenize_invalid_tokens": (
        "expects SGLang's 500 (an internal error) for a negative token id; minisgl refuses it with a 400"
    ),
}
# Passing, but 35-90 s each on two CPU cores (32 request shapes each, 48 concurrent 128-token requests,
# or 1,000-5,000-token prompts).
SLOW = {
    "TestOpenAIServer::test_regex",  # passes; kept out of the default suite's time budget
    "TestSRTEndpoint::test_logprob_grammar",
    "TestOpenAIServer::test_completion",
    "TestOpenAIServer::test_completion_stream",
    "TestSRTEndpoint::test_logprob_match",
    "TestSRTEndpoint::test_custom_logit_processor_batch_mixed",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.nodeid.split("::", 1)[1]
        reason = SKIPS.get(name) or SKIPS.get(name.split("::")[0])
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        if name in SLOW:
            item.add_marker(pytest.mark.slow)
