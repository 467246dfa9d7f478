"""`horovod.runner.util.threads.in_thread`, which Horovod's test utilities
import (tfdtape launches the processes; nothing here runs them)."""

import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Starts `target(*args)` in a thread and returns the thread."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
