"""`horovod.runner.common.util.env.get_env_rank_and_size`, which Horovod's
process-set test file reads before `init()`."""

import os


def get_env_rank_and_size():
    """(rank, size) from the launcher's environment (tfdtape launch sets
    Horovod's names), or None."""
    if "HOROVOD_RANK" in os.environ and "HOROVOD_SIZE" in os.environ:
        return int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    return None
