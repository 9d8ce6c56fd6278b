"""Start PyTorch's TCPStore server on HOST port 0 and print its port; serve until stdin closes.

usage: tcp_pytorch_server.py HOST [libuv|legacy]
"""
import sys
from datetime import timedelta

import torch.distributed as dist

host = sys.argv[1]
use_libuv = (sys.argv[2] if len(sys.argv) > 2 else "libuv") == "libuv"
s = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300), use_libuv=use_libuv)
print(s.port, flush=True)
sys.stdin.read()
