"""The state topic: one partition's changelog (its one owner) and the range reads of a restore."""
