"""``goald goal ACTION``'s arguments: create, list, describe, change, answer and move goals
(:mod:`daemon.cli.parser` adds them to the ``goald`` command)."""

from __future__ import annotations

from daemon.cli.options import (
    GOAL_HELP,
    GOAL_STATUSES,
    JSON_HELP,
    Subparsers,
    add_budget_options,
    add_goal_options,
)


def add_goal_parser(sub: Subparsers) -> None:
    """``goal ACTION``: create, list, describe, change and move goals."""
    goal = sub.add_parser("goal", help="manage goals")
    gsub = goal.add_subparsers(dest="goal_command", metavar="ACTION")
    add = gsub.add_parser("add", help="create a goal")
    add.add_argument("objective", help="what the goal should achieve (the agent reads it every round)")
    add_goal_options(add)
    add.add_argument(
        "--keep-workdir",
        action="store_true",
        help="keep the work directory goald makes for the goal after it ends (retention removes it otherwise)",
    )
    add.add_argument(
        "--node-label",
        metavar="LABEL",
        help="in a cluster, run the goal only on a node with this label ([cluster] labels): the host with its files",
    )
    add.add_argument(
        "--repo",
        metavar="PATH",
        help="work in a new git worktree of this repository, on a new branch (goald diffs each round)",
    )
    add.add_argument("--base", metavar="REF", help="with --repo: the commit to start from (default HEAD)")
    add.add_argument("--branch", metavar="NAME", help="with --repo: the new branch (default goald/<key or id>)")
    add.add_argument(
        "--commit-on-complete",
        action="store_true",
        help="with --repo: commit the last round's tree onto the branch when the goal completes",
    )
    add.add_argument("--json", action="store_true", help=JSON_HELP)
    lst = gsub.add_parser("list", help="list goals as a table (newest first)")
    lst.add_argument("--status", choices=GOAL_STATUSES, help="only goals of this status")
    lst.add_argument("--schedule", metavar="SCHEDULE", help="only goals started by this schedule (id, prefix or key)")
    lst.add_argument(
        "--since", metavar="WHEN", help="only goals created since: an ISO 8601 instant, or an age such as 30m, 2h, 1d"
    )
    lst.add_argument("--limit", type=int, metavar="N", help="only the newest N goals (the others are counted)")
    lst.add_argument(
        "--watch",
        "-w",
        action="store_true",
        help="draw the table again whenever a goal changes (kubectl get -w): in place on a terminal,"
        " a new table per change otherwise; Ctrl-C ends it (exit 0)",
    )
    lst.add_argument("--json", action="store_true", help=JSON_HELP)
    show = gsub.add_parser("show", help="describe one goal: status and why, activity, budgets, last events")
    show.add_argument("goal", help=GOAL_HELP)
    show.add_argument("--json", action="store_true", help="print the goal as JSON (goal/get)")
    show.add_argument("--watch", action="store_true", help="follow changes until the goal stops")
    _add_goal_transitions(gsub)
    edit = gsub.add_parser("edit", help="edit a goal's objective, budgets or verification")
    edit.add_argument("goal", help=GOAL_HELP)
    edit.add_argument("--objective", help="the new objective (used from the next round)")
    add_goal_options(edit, for_edit=True)
    edit.add_argument("--json", action="store_true", help=JSON_HELP)
    logs = gsub.add_parser("logs", help="a goal's events")
    logs.add_argument("goal", help=GOAL_HELP)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new events until the goal ends")
    logs.add_argument(
        "--tail", "-n", type=int, metavar="N", help="only the latest N events (journalctl -n, kubectl logs --tail)"
    )
    logs.add_argument(
        "--since", metavar="WHEN", help="only events since: an age such as 10m, 2h, 1d, or an ISO 8601 instant"
    )
    logs.add_argument("--json", action="store_true", help="one JSON object a line")
    _add_goal_transfer(gsub)
    _add_goal_questions(gsub)


def _add_goal_transitions(gsub: Subparsers) -> None:
    """``goal pause``, ``goal resume`` and ``goal cancel``."""
    for action in ("pause", "resume", "cancel"):
        a = gsub.add_parser(action, help=f"{action} a goal")
        a.add_argument("goal", nargs="?" if action == "resume" else None, help=GOAL_HELP)
        a.add_argument("--json", action="store_true", help=JSON_HELP)
        if action == "pause":
            a.add_argument(
                "--reason",
                metavar="TEXT",
                help="why you pause it, in your words (as Temporal's schedule toggle --pause --reason): kept with"
                " the pause and shown as 'paused (by operator: TEXT)'",
            )
        if action == "resume":
            add_budget_options(a)
            a.add_argument("--all", action="store_true", help="resume every paused goal (see --reason)")
            a.add_argument(
                "--reason",
                metavar="REASON",
                help="with --all: only goals paused for this reason, e.g. auth_error or by_operator (a filter)",
            )


def _add_goal_questions(gsub: Subparsers) -> None:
    """``goal answer``, ``goal withdraw`` and ``goal questions``."""
    ans = gsub.add_parser("answer", help="answer the question a waiting goal asked (it goes on at once)")
    ans.add_argument("goal", help=GOAL_HELP)
    ans.add_argument(
        "words", nargs="*", metavar="[QUESTION_ID] TEXT", help="the answer (a first word q_... names the question)"
    )
    ans.add_argument("--option", type=int, metavar="N", help="answer with the question's option N (from 1)")
    ans.add_argument("--json", action="store_true", help=JSON_HELP)
    wd = gsub.add_parser("withdraw", help="withdraw a waiting goal's question: it goes on without an answer")
    wd.add_argument("goal", help=GOAL_HELP)
    wd.add_argument("question", nargs="?", metavar="QUESTION_ID", help="the question (default: the one it waits on)")
    wd.add_argument("--reason", required=True, metavar="TEXT", help="why, in your words: the goal hears it")
    wd.add_argument("--json", action="store_true", help=JSON_HELP)
    df = gsub.add_parser("diff", help="what a goal on a repository changed: since its start, or in one round")
    df.add_argument("goal", help=GOAL_HELP)
    df.add_argument("--round", type=int, metavar="N", help="only what round N changed")
    df.add_argument("--stat", action="store_true", help="a line per file: lines added and removed")
    df.add_argument("--json", action="store_true", help=JSON_HELP)
    rp = gsub.add_parser("replay", help="the same goal again from the same start (another model, other budgets)")
    rp.add_argument("goal", help=GOAL_HELP)
    rp.add_argument("--model", help="PROVIDER:MODEL (default: the goal's)")
    rp.add_argument("--key", help="the new goal's key")
    add_budget_options(rp)
    rp.add_argument("--json", action="store_true", help=JSON_HELP)
    cm = gsub.add_parser("commit", help="commit a goal's latest recorded tree onto its branch (its repository's)")
    cm.add_argument("goal", help=GOAL_HELP)
    cm.add_argument("--message", "-m", metavar="TEXT", help="the commit message (default: the goal's title)")
    cm.add_argument("--json", action="store_true", help=JSON_HELP)
    rv = gsub.add_parser("revoke", help="revoke a call approved for a goal: it is asked about again")
    rv.add_argument("goal", help=GOAL_HELP)
    rv.add_argument("approval", nargs="?", metavar="APPROVAL", help="the approval, as goal show lists it")
    rv.add_argument("--all", action="store_true", help="every approval of the goal")
    rv.add_argument("--json", action="store_true", help=JSON_HELP)
    qs = gsub.add_parser("questions", help="list the questions goals asked (newest first)")
    qs.add_argument("goal", nargs="?", help=GOAL_HELP)
    qs.add_argument("--open", action="store_true", help="only those still waiting for an answer")
    qs.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (default 100)")
    qs.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_goal_transfer(gsub: Subparsers) -> None:
    """``goal export``, ``goal import`` and ``goal delete``: an ended goal leaving or arriving."""
    export = gsub.add_parser("export", help="write an ended goal with its sessions and events as a JSON document")
    export.add_argument("goal", help=GOAL_HELP)
    export.add_argument("-o", "--output", metavar="FILE", help="write here (must not exist) instead of stdout")
    imp = gsub.add_parser("import", help="add a goal exported by another daemon (refused if already here)")
    imp.add_argument("file", metavar="FILE", help="the export document (- reads stdin)")
    imp.add_argument("--json", action="store_true", help=JSON_HELP)
    delete = gsub.add_parser(
        "delete", help="delete an ended goal with its session and events (asks first; the work directory stays)"
    )
    delete.add_argument("goal", help=GOAL_HELP)
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (for scripts)")
    delete.add_argument("--json", action="store_true", help=JSON_HELP)
