"""The `orchestrator-zero` command.

Its modules:

- `audit_cmds.py`: `orchestrator-zero audit ...`.
- `audit_follow.py`: `audit follow`: the audit log's stream (GET /api/v1/events,
  docs/audit-events.md) printed as it comes, resumed from where it was after a disconnect.
- `client.py`: calls to the management API with the context's operator certificate.
- `cluster_cmds.py`: `orchestrator-zero cluster ...`.
- `completers.py`: live completions: node, job, token, schedule and tenant IDs, asked of the
  cluster when TAB is pressed (docs/run-a-cluster.md, "Shell completion").
- `completion_cmds.py`: `orchestrator-zero --install-completion`: shell completion of
  commands, flags and the cluster's IDs, in bash, zsh and fish (docs/run-a-cluster.md,
  "Shell completion").
- `enroll.py`: `operator enroll`'s side: read the code and the web password, pin the cluster
  by its CA hash, make the key here, and trade the code (with a certificate request) for a
  certificate.
- `file_cmds.py`: `orchestrator-zero file ...`: put files on the fleet's nodes
  (docs/files.md).
- `file_results.py`: what each node said of a file push (`file push`, `job show`): its job's
  output, one line per attempt (oz0_node/jobs/file_push.py).
- `file_upload.py`: a local file stored in the cluster for pushes (`file push`, `job run
  --file`): hashed, registered, and only the chunks the cluster lacks sent
  (oz0/server/api/files.py).
- `job_cmds.py`: `orchestrator-zero job ...`: run a command on the fleet, follow it, list,
  show, cancel.
- `job_follow.py`: printing a job's output as it comes, from pages of GET
  /api/v1/jobs/<id>/output.
- `job_lines.py`: `job run --output MODE`: how the output of many nodes is laid out.
- `job_params.py`: what `job run` reads from its command line: durations, KEY=VALUE pairs,
  sizes and CPU fractions (limits), a job ID.
- `job_recap.py`: where a job's parts are, as `job run` shows it: the one live line while it
  runs (as Salt's `--progress`) and the recap at its end (as Ansible's PLAY RECAP and Salt's
  `--summary`).
- `job_screen.py`: writing a followed job's output with a status line on stderr.
- `job_view.py`: what `job run` shows of a job it follows, when more than its bytes: the
  output laid out by its mode (cli/job_lines.py), the live line of where the parts are
  (cli/job_recap.py).
- `main.py`: the root of `orchestrator-zero`; each command group lives in a module of its
  own.
- `node_cmds.py`: `orchestrator-zero node ...`: see the fleet, approve joins, shut nodes
  out, remove them.
- `operator_cmds.py`: `orchestrator-zero operator ...`: the cluster's people (an admin's
  `add`, `list`, `show`, `set`, `remove`), a new person's `enroll`, and everyone's own
  `renew`.
- `output.py`: printing data for people (aligned columns) and for scripts (--json).
- `paging.py`: lists the API pages (`limit`, `cursor`, `next_cursor`): follow them to the
  end, or until `--limit` rows, printing each page as it comes.
- `params.py`: parameter types shared by every command group.
- `schedule_cmds.py`: `orchestrator-zero schedule ...`: jobs run on a cron or an interval by
  Temporal Schedules.
- `server_cmds.py`: `orchestrator-zero server ...`: commands run on a server's machine.
- `session_client.py`: the CLI's end of an interactive session (`node exec`, `node shell`;
  docs/sessions.md): a websocket to the management API of the server holding the node's
  stream.
- `session_cmds.py`: `orchestrator-zero session ...`: the sessions opened on nodes (`node
  shell`, `node exec`), and their recordings played back (docs/sessions.md).
- `tenant_cmds.py`: `orchestrator-zero tenant ...`.
- `token_cmds.py`: `orchestrator-zero token ...`.
"""
