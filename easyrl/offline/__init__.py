"""Offline data: recording what actors collect (`output:`), datasets as directories of
compressed npz shards (`dataset`), training from them (`input:`, the memory shards load
them) and off-policy evaluation of the learned policy on them (`ope`)."""
