"""User-level programs on top of torchtpu: the ``torchtpu`` command (``cli``) and the demo."""
