"""The core: what a tpu tensor is (``tensor``), its dtypes (``dtypes``), and what a program is (``program``).

``tensor`` is the only module that reads a tensor's device representation;
every executor goes through its functions and ``Buffer``'s public members.
"""
