"""Start the HTTP server: ``python -m minisgl.launch_server --model-path DIR --port 30000``.

Mirrors python/sglang/launch_server.py. SGLang's ServerArgs also carries host,
port and api_key; minisgl's ServerArgs describes only the engine, so the HTTP
flags are added here.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Optional

from minisgl.entrypoints.http_server import launch_server
from minisgl.managers.scheduler_client import run_nonzero_rank_node
from minisgl.server_args import ServerArgs


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="minisgl OpenAI-compatible HTTP server")
    ServerArgs.add_cli_args(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind; the default keeps the server local")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health"
    )
    parser.add_argument("--served-model-name", default=None, help="the model name clients pass (default: --model-path)")
    args, unknown = parser.parse_known_args(argv)
    for arg in unknown:
        if arg.startswith("-"):
            parser.error(_unknown_flag_message(parser, arg.split("=", 1)[0]))
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    server_args = ServerArgs.from_cli_args(args)
    if server_args.node_rank >= 1:
        # As in SGLang: a node other than node 0 serves no HTTP, only its ranks of the TP group.
        run_nonzero_rank_node(server_args)
        return
    launch_server(
        server_args,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        # The name the user gave (the default model's alias, say), not the folder it resolved to.
        served_model_name=args.served_model_name or args.model_path,
    )


def _unknown_flag_message(parser: argparse.ArgumentParser, flag: str) -> str:
    """An unknown flag, with the nearest minisgl one: an SGLang user's flag is often a near miss."""
    known = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    nearest = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    hint = f"; did you mean {nearest[0]}?" if nearest else " (minisgl keeps a subset of SGLang's flags; see --help)"
    return f"unrecognized argument {flag}{hint}"


if __name__ == "__main__":
    main()
