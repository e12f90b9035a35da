"""Chaos run of the proxy, its store and the engine: issue 15's figures, measured again.

The services start as the README's "The proxy on its own" starts them (``dressage engine serve``
with the tiny model of ``dressage assets``, ``dressage-proxy --record-token-versions``, keys in
``DRESSAGE_PROXY_ADMIN_KEY`` and ``DRESSAGE_ENGINE_ADMIN_KEY``), as subprocesses on loopback,
and are attacked in seven parts, then Airflow itself in an eighth (the modules of
``scripts/chaos_parts/`` say how):

1. ``kill -9`` of the proxy, round after round, under live multi-turn sessions of the ``openai``
   SDK: no answered step lost or duplicated after each restart, and every session goes on;
2. a flipped byte and a torn tail in a copy of that store: the proxy starts, reports both,
   answers 200 on every export, and the other sessions are intact;
3. many keep-alive sessions at once (the SDK's default pool): calls and errors by kind;
4. the engine killed with calls in flight: how the proxy answers, ``/ready``, streams, retries;
5. the schema fuzz tests at a larger scale (``DRESSAGE_FUZZ_SCALE``);
6. the auth matrices and the bad-input tests, run and counted;
7. the embedded MOPD training job killed with ``kill -9`` mid-run and run again on its folder:
   it resumes from its last checkpoint, loses at most one save interval of steps, logs every
   step once, and ends as accurate as uninterrupted runs of the same seeds;
8. Airflow's scheduler and triggerer killed with ``kill -9`` while a ``dressage_mopd`` run's
   ``train`` is deferred, and started again: the job runs on in its own session, the new
   triggerer polls it to its end, and the run succeeds with ``train`` on its first try and
   every step logged once.

    python scripts/chaos.py            # the full run: about 35 minutes on 2 cores
    python scripts/chaos.py --quick    # every part, small numbers (the test runs all but 8)
    python scripts/chaos.py --parts soak --soak-seconds 10
    python scripts/chaos.py --parts resume     # part 7 alone: 3 seeds, straight and crashed
    python scripts/chaos.py --parts airflow    # part 8 alone: about 5 minutes on 2 cores

The last line printed is one JSON object with every figure; ``ok`` says whether each part held.
Everything runs under a temporary folder (``--workdir`` keeps it, with every service's log).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's dressage first
# chaos_parts (and dressage with it) is imported once the arguments are checked: a refused
# command line costs no import of the services.

PARTS = ("kills", "damage", "soak", "engine_death", "fuzz", "suites", "resume", "airflow")
FULL: dict[str, Any] = {
    "kill_sessions": 20,
    "kill_rounds": 5,
    "kill_round_s": 6.0,
    "soak_sessions": 256,
    "soak_seconds": 60.0,
    "think": (4.0, 6.0),
    "death_calls": 32,
    "fuzz_scale": 10.0,
    "resume_seeds": (0, 1, 2),
    "resume_steps": 100,
    "save_interval": 10,
    "kill_after": 55,
    "resume_prompts": 32,
    "resume_parallel": 3,
    "airflow_steps": 12,
    "airflow_save_interval": 4,
    "restart_after_s": 5.0,
}
QUICK: dict[str, Any] = {
    "kill_sessions": 4,
    "kill_rounds": 1,
    "kill_round_s": 2.0,
    "soak_sessions": 8,
    "soak_seconds": 2.0,
    "think": (0.2, 0.5),
    "death_calls": 4,
    "fuzz_scale": 0.05,
    "resume_seeds": (0,),
    "resume_steps": 3,
    "save_interval": 1,
    "kill_after": 2,
    "resume_prompts": 2,
    "resume_parallel": 2,
    "airflow_steps": 3,
    "airflow_save_interval": 1,
    "restart_after_s": 1.0,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="every part with small numbers")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    p.add_argument("--kill-sessions", type=int)
    p.add_argument("--kill-rounds", type=int)
    p.add_argument("--soak-sessions", type=int)
    p.add_argument("--soak-seconds", type=float, help="the soak's duration (full run: 60)")
    p.add_argument("--death-calls", type=int, help="calls in flight when the engine dies")
    p.add_argument("--fuzz-scale", type=float, help="DRESSAGE_FUZZ_SCALE of the fuzz tests")
    p.add_argument(
        "--resume-seeds",
        type=lambda t: tuple(int(x) for x in t.split(",")),
        help="part 7's seeds, comma-separated (full run: 0,1,2)",
    )
    p.add_argument("--resume-steps", type=int, help="part 7's training steps (full run: 100)")
    p.add_argument("--save-interval", type=int, help="part 7's steps between checkpoints")
    p.add_argument("--kill-after", type=int, help="part 7: kill -9 once this step is printed")
    p.add_argument("--resume-prompts", type=int, help="part 7's prompts per step")
    p.add_argument("--resume-parallel", type=int, help="part 7's jobs at once")
    p.add_argument("--airflow-steps", type=int, help="part 8's training steps (full run: 12)")
    p.add_argument("--airflow-save-interval", type=int, help="part 8's steps between checkpoints")
    p.add_argument(
        "--restart-after-s", type=float, help="part 8: seconds from the kills to the restart"
    )
    p.add_argument("--workdir", type=Path, help="keep logs and stores here (default: a temp dir)")
    args = p.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        p.error(f"--parts: unknown {unknown}; known: {list(PARTS)}")
    if "damage" in parts and "kills" not in parts:
        p.error("--parts: damage works on the store that kills leaves; add kills")
    args.parts = parts
    numbers = dict(QUICK if args.quick else FULL)
    for name in numbers:
        if getattr(args, name, None) is not None:
            numbers[name] = getattr(args, name)
    for name, value in numbers.items():
        if name not in ("think", "resume_seeds") and not value > 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not numbers["kill_after"] < numbers["resume_steps"]:
        p.error(
            f"--kill-after {numbers['kill_after']} must be below --resume-steps "
            f"{numbers['resume_steps']} (the job must be killed mid-run)"
        )
    if numbers["airflow_steps"] < 2:
        p.error(
            f"--airflow-steps must be at least 2, got {numbers['airflow_steps']} (Airflow is "
            "killed after step 1, mid-run)"
        )
    args.numbers = numbers
    return args


def held(figures: dict[str, Any], parts: list[str]) -> dict[str, bool]:
    """Per part asked for, whether what issue 15 asks held (a part without figures did not)."""
    ok = dict.fromkeys(parts, False)
    if k := figures.get("kills"):
        ok["kills"] = (
            k["lost"] == 0
            and k["duplicated"] == 0
            and k["answered"] > 0
            and k["sessions_continued_after_last_restart"] == k["sessions"]
            and k["finalized_200"] == k["sessions"]
        )
    if d := figures.get("damage"):
        ok["damage"] = (
            d["flipped_charged"]
            and d["torn_reported"]
            and d["exports_200"] == d["exports"]
            and d["other_sessions_intact"] == d["other_sessions"]
        )
    if s := figures.get("soak"):
        ok["soak"] = s["answered"] > 0 and s["failed"] == 0
    if e := figures.get("engine_death"):
        ok["engine_death"] = (
            e["hung"] == 0
            and e["new_call"]["outcome"] == "HTTP 503"
            and e["ready_503"]["s"] is not None
            and e["retries"] == {"answered": e["calls"]}
            and not any("answered" in o or "without" in o for o in e["outcomes"])
        )
    if f := figures.get("fuzz"):
        ok["fuzz"] = f["tests"]["cases"] > 0 and f["tests"]["failed"] == 0 and f["5xx"] == 0
    if r := figures.get("resume"):
        from chaos_parts.resume import held as resume_held

        ok["resume"] = resume_held(r)
    if a := figures.get("airflow"):
        from chaos_parts.airflow_restart import held as airflow_held

        ok["airflow"] = airflow_held(a)
    if t := figures.get("suites"):
        ok["suites"] = (
            t["tests"]["failed"] == 0
            and t["bad_input_cases"] > 0
            and t["bad_credential_attempts"] > 0
            and t["bad_credentials_refused"] == t["bad_credential_attempts"]
        )
    return ok


def services_parts(args: argparse.Namespace, workdir: Path, figures: dict[str, Any]) -> None:
    """Parts 1 to 4: one engine and one proxy (started together), killed and started again.
    From part 2 on, the proxy that started on the damaged copy serves; with ``--quick`` it
    starts while part 3 runs on the first one (a smoke run measures nothing)."""
    from chaos_parts import kills, load
    from chaos_parts.services import Service, Services, free_port

    n, parts = args.numbers, args.parts
    with Services(workdir) as services:
        port = free_port()
        engine = services.engine(port)
        proxy = services.proxy(f"http://127.0.0.1:{port}", workdir / "store", free_port(), "proxy")
        figures["engine_start_s"] = round(engine.wait_ready(), 2)
        figures["proxy_start_s"] = round(proxy.wait_ready(), 2)
        if "kills" in parts:
            print(f"part 1: kill -9 of the proxy under {n['kill_sessions']} sessions")
            figures["kills"], segments = kills.kill_rounds(
                services, proxy, sessions=n["kill_sessions"], rounds=n["kill_rounds"],
                round_s=n["kill_round_s"],
            )  # fmt: skip
        damaged: Service | None = None
        if "damage" in parts:
            print("part 2: a flipped byte and a torn tail in a copy of the store")
            damage = kills.damage_copy(workdir / "store", workdir / "store-damaged")
            damaged = services.proxy(engine.url, workdir / "store-damaged", free_port(), "damaged")

        def on_the_damaged_copy() -> Service:
            assert damaged is not None
            figures["damage"] = kills.check_damaged(services, damaged, damage, segments)
            proxy.kill9()
            return damaged

        if damaged is not None and not args.quick:
            proxy = on_the_damaged_copy()
        if "soak" in parts:
            print(f"part 3: {n['soak_sessions']} sessions for {n['soak_seconds']} s")
            figures["soak"] = load.soak(
                proxy.url, sessions=n["soak_sessions"], seconds=n["soak_seconds"], think=n["think"]
            )
        if damaged is not None and args.quick:
            proxy = on_the_damaged_copy()
        if "engine_death" in parts:
            print(f"part 4: the engine killed under {n['death_calls']} calls")
            figures["engine_death"] = load.engine_death(engine, proxy.url, calls=n["death_calls"])


def run(args: argparse.Namespace, workdir: Path, figures: dict[str, Any]) -> None:
    """Every part asked for, into ``figures``. The test suites (parts 5 and 6) run after the
    services, alone on the machine; with ``--quick`` beside them (a smoke run measures
    nothing)."""
    from chaos_parts import suites

    n, parts = args.numbers, args.parts
    tests = suites.Suites(workdir, parts, fuzz_scale=n["fuzz_scale"], quick=args.quick)
    try:
        if args.quick:
            tests.start()
        if {"kills", "damage", "soak", "engine_death"} & set(parts):
            services_parts(args, workdir, figures)
        if not args.quick and tests.files:
            print("parts 5 and 6: the fuzz tests, the auth matrices, the bad-input tests")
            tests.start()
            figures.update(tests.result())
        if "resume" in parts:
            from chaos_parts.resume import resume_round

            print(
                f"part 7: the MOPD job killed after step {n['kill_after']} of "
                f"{n['resume_steps']} and run again, seeds {list(n['resume_seeds'])}"
            )
            figures["resume"] = resume_round(
                workdir, seeds=list(n["resume_seeds"]), steps=n["resume_steps"],
                save_interval=n["save_interval"], kill_after=n["kill_after"],
                prompts=n["resume_prompts"], parallel=n["resume_parallel"], quick=args.quick,
            )  # fmt: skip
        if "airflow" in parts:
            from chaos_parts.airflow_restart import airflow_restart_round

            print(
                f"part 8: Airflow's scheduler and triggerer killed with kill -9 during train "
                f"({n['airflow_steps']} steps) and started again"
            )
            figures["airflow"] = airflow_restart_round(
                workdir, steps=n["airflow_steps"], save_interval=n["airflow_save_interval"],
                restart_after_s=n["restart_after_s"],
            )  # fmt: skip
        if args.quick or not tests.files:
            figures.update(tests.result())
    finally:
        tests.stop()


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress lines
    args = parse_args(sys.argv[1:] if argv is None else argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dressage-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    figures: dict[str, Any] = {"mode": "quick" if args.quick else "full", "numbers": args.numbers}
    figures["loadavg_before"] = os.getloadavg()
    try:
        run(args, workdir, figures)
    except Exception as exc:  # the summary still comes, with what was measured and the error
        traceback.print_exc()
        figures["error"] = repr(exc)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    figures["loadavg_after"] = os.getloadavg()
    figures["ok"] = held(figures, args.parts)
    figures["all_ok"] = all(figures["ok"].values())
    figures["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures))
    return 0 if figures["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
