"""Where an op being built will run: inside a control-flow body, inside what
`tf.vectorized_map` and `jacobian` vectorize, or once per call.

A collective (an all-reduce across replicas or workers) must run exactly
once on every replica and worker, and a tape around `strategy.run` records
what TensorFlow differentiates from tapes, not from a control-flow body's
graph: both questions are asked here.
"""

from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_v2_func_graphs

PFOR_BODY_SCOPE = "loop_body"
"""The name scope `tf.vectorized_map` and `jacobian` trace their loop body in
(`parallel_for.control_flow_ops._pfor_impl`), run once per iteration."""


def in_control_flow_body(graph):
    """Whether `graph` is a control-flow body (a `tf.cond` branch, a
    `tf.while_loop` body; v2 or v1), which TensorFlow differentiates from
    its graph, not from what tapes record."""
    return (isinstance(graph, control_flow_v2_func_graphs.ControlFlowFuncGraph) or
            graph._get_control_flow_context() is not None)


def runs_once_here():
    """Whether an op made now runs exactly once per call of what is being
    built: eagerly, or in a graph outside control-flow bodies and outside
    what pfor vectorizes."""
    if context.executing_eagerly():
        return True
    return not (in_control_flow_body(ops.get_default_graph()) or
                PFOR_BODY_SCOPE in ops.get_name_scope().split("/"))
