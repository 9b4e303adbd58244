"""torchrun worker for tests/test_train.py's check of the shared launch (tests/workers/run_server.py): stops as a run
that stopped itself (exit 3), leaving behind in its process what argv[1] names: `nothing`, or `something`: a thread, a
child process (that ends by itself 30 s later) and an open file."""
import os
import subprocess
import sys
import threading
import time

if sys.argv[1] == "something":
    threading.Thread(target=time.sleep, args=(3600,), name="left-behind", daemon=True).start()
    subprocess.Popen(["sleep", "30"])
    os.open(__file__, os.O_RDONLY)  # a descriptor no object owns: never closed
sys.exit(3)
