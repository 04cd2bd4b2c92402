"""Runtime: devices, memory accounting, RNG keys and the compile caches."""
