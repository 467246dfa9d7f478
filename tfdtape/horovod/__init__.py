"""Horovod's TensorFlow API on TensorFlow's own collectives:
`import tfdtape.horovod as hvd` in place of `import horovod.tensorflow as
hvd`, and `tfdtape launch` in place of `horovodrun`.

The engine is `basics` (the job, from the launcher's TF_CONFIG, a
TF_CONFIG of your own, or a Slurm allocation) and `collectives`
(TensorFlow's), the operations are `ops` and `exchange` (each checked
across the processes by `negotiation`, fused by `fusion`), the tapes are
`tape`, `optimizer` horovod.tensorflow's DistributedOptimizer and `keras`
the Keras side (wrapped as Horovod wraps, `wrapping`), and `elastic`
Horovod's elastic API on a job that restarts (`tfdtape launch
--max-restarts`). What Horovod has and this does not raises
NotImplementedError naming the alternative (`unsupported`).
docs/horovod.md maps one to the other.
"""

import tensorflow as _tf

from tfdtape.horovod import elastic
from tfdtape.horovod.basics import ccl_built
from tfdtape.horovod.basics import cross_rank
from tfdtape.horovod.basics import cross_size
from tfdtape.horovod.basics import cuda_built
from tfdtape.horovod.basics import ddl_built
from tfdtape.horovod.basics import gloo_built
from tfdtape.horovod.basics import gloo_enabled
from tfdtape.horovod.basics import is_homogeneous
from tfdtape.horovod.basics import is_initialized
from tfdtape.horovod.basics import local_rank
from tfdtape.horovod.basics import local_rank_op
from tfdtape.horovod.basics import local_size
from tfdtape.horovod.basics import local_size_op
from tfdtape.horovod.basics import mpi_built
from tfdtape.horovod.basics import mpi_enabled
from tfdtape.horovod.basics import mpi_threads_supported
from tfdtape.horovod.basics import nccl_built
from tfdtape.horovod.basics import rank
from tfdtape.horovod.basics import rank_op
from tfdtape.horovod.basics import rocm_built
from tfdtape.horovod.basics import shutdown
from tfdtape.horovod.basics import size
from tfdtape.horovod.collectives import Adasum
from tfdtape.horovod.collectives import Average
from tfdtape.horovod.collectives import Max
from tfdtape.horovod.collectives import Min
from tfdtape.horovod.collectives import Product
from tfdtape.horovod.collectives import Sum
from tfdtape.horovod.compression import Compression
from tfdtape.horovod.exchange import alltoall
from tfdtape.horovod.exchange import grouped_reducescatter
from tfdtape.horovod.exchange import reducescatter
from tfdtape.horovod.ops import allgather
from tfdtape.horovod.ops import allgather_object
from tfdtape.horovod.ops import allreduce
from tfdtape.horovod.ops import broadcast
from tfdtape.horovod.ops import broadcast_
from tfdtape.horovod.ops import broadcast_global_variables
from tfdtape.horovod.ops import broadcast_object
from tfdtape.horovod.ops import broadcast_variables
from tfdtape.horovod.ops import grouped_allgather
from tfdtape.horovod.ops import grouped_allreduce
from tfdtape.horovod.optimizer import DistributedOptimizer
from tfdtape.horovod.process_sets import ProcessSet
from tfdtape.horovod.process_sets import add_process_set
from tfdtape.horovod.process_sets import global_process_set
from tfdtape.horovod.process_sets import init
from tfdtape.horovod.process_sets import process_set_included_op
from tfdtape.horovod.process_sets import remove_process_set
from tfdtape.horovod.process_sets import size_op
from tfdtape.horovod.sync_batch_norm import SyncBatchNormalization
from tfdtape.horovod.tape import DistributedGradientTape
from tfdtape.horovod.tape import PartialDistributedGradientTape
from tfdtape.horovod.unsupported import refusing as _refusing

_executing_eagerly = _tf.executing_eagerly  # Horovod's; its tests and programs call it
join = _refusing("join")
start_timeline = _refusing("timeline")
stop_timeline = _refusing("timeline")


__all__ = [
    "Adasum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "Average",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "ccl_built",
    "Compression",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "Max",
    "Min",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "PartialDistributedGradientTape",
    "process_set_included_op",
    "ProcessSet",
    "Product",
    "rank",
    "rank_op",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
    "Sum",
    "SyncBatchNormalization",
]
