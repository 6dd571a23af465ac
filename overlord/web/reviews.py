"""Second-model reviews started from the pages. A review is a model conversation of up to a
dozen turns, so like a chat's run it goes on in a thread of its own: POST
/api/session/SID/review starts it and answers at once; the dossier (and GET
/api/session/SID/reviews, which the pages poll while one runs) says `reviewing` until it ends,
then lists its verdict with the others. A review that fails says why in `error`.

One review at a time per session; the verdict itself is recorded by ops.review, never here.
"""
import contextvars
import threading
import time

from overlord.errors import OverlordError


class Reviews:
    def __init__(self):
        self._lock = threading.Lock()
        self.runs = {}            # sid -> {running, reviewer, started, finished, error, verdict}

    def running(self, sid):
        run = self.runs.get(sid)
        return bool(run and run["running"])

    def status(self, sid):
        """What the pages show of the latest review started here (None: none was)."""
        run = self.runs.get(sid)
        return dict(run) if run else None

    def start(self, sid, reviewer, call):
        """Run call() (ops.review with the settings' second model) in a thread."""
        with self._lock:
            if self.running(sid):
                raise OverlordError(f"a second-model review of session {sid} is already under "
                                    "way: wait for its verdict", http_status=409)
            run = {"running": True, "reviewer": reviewer, "started": time.time(),
                   "finished": None, "error": None, "verdict": None}
            self.runs[sid] = run

        def work():
            verdict, error = None, None
            try:
                verdict = call()
            except OverlordError as exc:
                error = str(exc)
            except Exception as exc:  # noqa: BLE001 - a review's failure is shown, never a dead thread
                error = f"internal error: {type(exc).__name__}: {exc}"
            with self._lock:
                run.update(running=False, finished=time.time(), error=error,
                           verdict=(verdict or {}).get("verdict") if isinstance(verdict, dict) else None)
        ctx = contextvars.copy_context()          # the account that asked acts in the thread too
        threading.Thread(target=ctx.run, args=(work,), name="overlord-review", daemon=True).start()
        return dict(run)
