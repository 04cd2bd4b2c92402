"""Many chips through ``torch.distributed``: the c10d backend "tpu", meshes, collectives as XLA programs.

Empty for now: the distributed issue fills it.  It will sit above ``eager``
and ``compile`` (collectives are programs like any other) and below ``api``.
"""
