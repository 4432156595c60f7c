"""Engine: the offline entry point, ``Engine(model_path=...).generate(...)``.

Mirrors python/sglang/srt/entrypoints/engine.py (Engine.__init__, generate,
shutdown, the expert-distribution methods). SGLang's Engine launches a
tokenizer manager, scheduler processes and a detokenizer connected by ZMQ;
minisgl's Engine owns one in-process Scheduler and drives its loop until the
requests it was given are done. With tp_size > 1 it starts one scheduler
process per rank instead and drives them, through rank 0, the same way
(SchedulerClient); on a node other than node 0 it only runs that node's ranks.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any, Optional, Union

from tqdm import tqdm

from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.managers.scheduler import Scheduler
from minisgl.managers.scheduler_client import SchedulerClient, run_nonzero_rank_node
from minisgl.sampling.sampling_params import SamplingParams
from minisgl.server_args import ServerArgs


class Engine:
    def __init__(self, **kwargs: Any) -> None:
        try:
            self.server_args = ServerArgs(**kwargs)
        except TypeError as e:
            raise ValueError(f"unknown engine argument: {e}") from None
        if self.server_args.node_rank >= 1:
            # As SGLang's Engine on a non-zero node: run this node's ranks until node 0 shuts down.
            run_nonzero_rank_node(self.server_args)
            self.scheduler = None
            return
        if self.server_args.tp_size == 1:
            self.scheduler = Scheduler(self.server_args)
        else:
            self.scheduler = SchedulerClient(self.server_args)
            self.server_args = self.scheduler.server_args  # now with the dist_init_addr it chose
        self.tokenizer = self.scheduler.tokenizer
        self.vocab_size = self.scheduler.worker_info.vocab_size
        self._counter = itertools.count()

    def generate(
        self,
        prompt: Optional[Union[str, list[str]]] = None,
        sampling_params: Optional[Union[dict, list[dict]]] = None,
        input_ids: Optional[Union[list[int], list[list[int]]]] = None,
        return_logprob: Union[bool, list[bool]] = False,
        logprob_start_len: Optional[Union[int, list[int]]] = None,
        top_logprobs_num: Optional[Union[int, list[int]]] = None,
        token_ids_logprob: Optional[Union[list[int], list[list[int]]]] = None,
        return_hidden_states: bool = False,
        return_routed_experts: bool = False,
        show_progress: bool = True,
    ) -> Union[dict, list[dict]]:
        """One prompt (or one id list) gives one dict; a list gives a list, in order."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt and input_ids")
        single = isinstance(prompt, str) or (input_ids is not None and (not input_ids or isinstance(input_ids[0], int)))
        if single:
            prompts, id_lists = ([prompt], None) if prompt is not None else (None, [input_ids])
        else:
            prompts, id_lists = (list(prompt), None) if prompt is not None else (None, list(input_ids))
        n = len(prompts if prompts is not None else id_lists)

        def per_req(value, i):
            return value[i] if isinstance(value, list) else value

        # Refuse what the engine was not started for, before anything is queued (SGLang does the same).
        if return_hidden_states and not self.server_args.enable_return_hidden_states:
            raise ValueError("return_hidden_states needs the engine started with enable_return_hidden_states=True")
        if return_routed_experts and not self.server_args.enable_return_routed_experts:
            raise ValueError("return_routed_experts needs the engine started with enable_return_routed_experts=True")

        reqs = []
        for i in range(n):
            params = SamplingParams.from_dict(sampling_params[i] if isinstance(sampling_params, list) else sampling_params)
            params.verify(self.vocab_size)
            text = prompts[i] if prompts is not None else None
            ids = self.tokenizer.encode(text) if text is not None else list(id_lists[i])
            start = per_req(logprob_start_len, i)
            ids_logprob = token_ids_logprob
            if not single and token_ids_logprob and isinstance(token_ids_logprob[0], list):
                ids_logprob = token_ids_logprob[i]
            reqs.append(
                TokenizedGenerateReqInput(
                    rid=f"{next(self._counter)}-{uuid.uuid4().hex[:8]}",
                    input_text=text,
                    input_ids=ids,
                    sampling_params=params,
                    return_logprob=bool(per_req(return_logprob, i)),
                    logprob_start_len=-1 if start is None else start,
                    top_logprobs_num=per_req(top_logprobs_num, i) or 0,
                    token_ids_logprob=ids_logprob,
                    return_hidden_states=return_hidden_states,
                    return_routed_experts=return_routed_experts,
                )
            )
        for req in reqs:
            self.scheduler.handle_generate_request(req)
        results = self._run_until_done(reqs, show_progress=show_progress and n > 1)
        return results[0] if single else results

    def _run_until_done(self, reqs: list[TokenizedGenerateReqInput], show_progress: bool) -> list[dict]:
        pending = {r.rid: r for r in reqs}
        output_ids: dict[str, list[int]] = {r.rid: [] for r in reqs}
        done: dict[str, dict] = {}
        with tqdm(total=len(reqs), disable=not show_progress, desc="generate") as bar:
            while len(done) < len(reqs):
                for out in self.scheduler.step():
                    if out.rid not in pending:
                        continue
                    output_ids[out.rid] += out.new_output_ids
                    if out.finished:
                        done[out.rid] = self._make_result(pending[out.rid], output_ids[out.rid], out.meta_info)
                        bar.update(1)
        return [done[r.rid] for r in reqs]

    def _make_result(self, req: TokenizedGenerateReqInput, output_ids: list[int], meta: dict) -> dict:
        params = req.sampling_params
        matched = meta["finish_reason"].get("matched")
        # A stop token or stop string ends the text and is not part of it (SGLang's default);
        # output_ids keep the stop token.
        text_ids = output_ids[:-1] if isinstance(matched, int) else output_ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=params.skip_special_tokens)
        if isinstance(matched, str) and matched in text:
            text = text[: text.index(matched)]
        return {"text": text, "output_ids": output_ids, "meta_info": meta}

    # ---- expert distribution recorder (SGLang's Engine method names) ---------------------

    def start_expert_distribution_record(self) -> None:
        self.scheduler.expert_distribution_handle("start")

    def stop_expert_distribution_record(self) -> None:
        self.scheduler.expert_distribution_handle("stop")

    def dump_expert_distribution_record(self, output_path: Optional[str] = None) -> dict:
        return self.scheduler.expert_distribution_handle("dump", output_path)

    def shutdown(self) -> None:
        if isinstance(self.scheduler, SchedulerClient):
            self.scheduler.shutdown()
        self.scheduler = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
