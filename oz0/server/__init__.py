"""`server start`: one process, one trio.run, every role as a task of one root nursery."""
