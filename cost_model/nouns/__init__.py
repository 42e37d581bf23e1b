"""The vocabulary: layouts, workloads, models, hardware, cases, stacks, their codecs, units and errors.

Types and how they are read and written, no pricing. Nothing here imports anything of ours outside this
package (tests/test_code_shape.py keeps it so); the cost model's verbs (cost_model/) price these nouns.
"""
