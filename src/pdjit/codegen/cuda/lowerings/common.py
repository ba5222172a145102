"""Ops whose definitions' own target-neutral lowerings run on this target as they are."""
from pdjit.codegen.cuda.lowerings import generic

generic("adam", "momentum", "sgd", "softmax")
