"""A live stdio MCP server answering one huge line: the time and peak memory it costs the mirror to refuse it.

A real stdio MCP server (``tests/helpers/rogue_mcp_server.py``, its ``big`` tool) answers one call with a result of
``--mb`` MiB on one line.  Each size is asked in a fresh process, through the transport the mirror uses
(``responders/mcp_live/stdio.py``: lines read at most 17 MiB long as they stream) and through the SDK's own
``stdio_client`` (every chunk joined to the line so far, unbounded), so the figures say what the bounded
transport saves.  Both refuse the result (over the 16 MiB a record keeps); the figure is how long the refusal
takes and the process's peak RSS::

    python benchmarks/mcp_big_results.py [--mb 50 200] [--timeout 300]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ONE = """
import resource, sys, time
sys.path.insert(0, sys.argv[3])
from stabletoolbench_mirror.config_sections import McpServerConfig
from stabletoolbench_mirror.responders.mcp_live import client
config = McpServerConfig(command=sys.executable, args=[sys.argv[3] + "/tests/helpers/rogue_mcp_server.py", "--big-bytes",
                         str(int(sys.argv[2]) << 20)], start_timeout_s=60, call_timeout_s=3600)
server = client.LiveServer("rogue", config)
if sys.argv[1] == "sdk":
    from mcp.client.stdio import StdioServerParameters
    server._transport = lambda: StdioServerParameters(command=config.command, args=list(config.args))
server.start()
started = time.perf_counter()
try:
    server.call("big", {})
    outcome = "kept"
except client.LiveServerDown as exc:
    outcome = "refused" if "over" in str(exc) else str(exc)[:80]
print(f"{time.perf_counter() - started:.2f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} {outcome}")
server.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one refusal may take before it is given up")
    args = parser.parse_args()
    print(f"{'transport':<22} {'result MiB':>10} {'seconds':>9} {'peak RSS MiB':>13}  outcome")
    for mb in args.mb:
        for kind, name in (("bounded", "the mirror's (bounded)"), ("sdk", "the SDK's stdio_client")):
            try:
                done = subprocess.run([sys.executable, "-c", ONE, kind, str(mb), str(REPO)], capture_output=True, text=True,
                                      timeout=args.timeout, check=True)
                seconds, rss, outcome = done.stdout.split(maxsplit=2)
                print(f"{name:<22} {mb:>10} {float(seconds):>9.2f} {rss:>13}  {outcome.strip()}")
            except subprocess.TimeoutExpired:
                print(f"{name:<22} {mb:>10} {'>' + format(args.timeout, 'g'):>9} {'-':>13}  not done")


if __name__ == "__main__":
    main()
