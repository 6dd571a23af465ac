"""`overlord skills list|show|add|new|rm`: parse, call overlord.ops, render."""

from overlord import ops
from overlord.cli import render as R
from overlord.text import jsonable


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    p = sub.add_parser("skills", help="skills: SKILL.md know-how the agent loads when it fits",
                       description="A skill is a folder with a SKILL.md (front matter name, "
                       "description, optional when) and any supporting files. Project skills: "
                       ".overlord/skills/NAME/ in the folder (part of the transaction); machine "
                       "skills: OVERLORD_HOME/skills/NAME/ (installed with `skills add`), capped "
                       "per folder by the policy key `skills`. docs/SKILLS.md has the details.")
    ps = p.add_subparsers(dest="skills_command", metavar="ACTION", parser_class=type(p))
    ps.required = True
    s = ps.add_parser("list", help="the skills a session on a folder is offered",
                      description="The folder's project skills and the machine skills, each "
                      "with whether it is offered (shadowed by a project skill, or not allowed "
                      "by the folder's policy), and a warning for each SKILL.md that is skipped. "
                      "Without -t: the machine skills only.")
    s.add_argument("-t", "--target", metavar="DIR", help="the folder (default: machine skills only)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s = ps.add_parser("show", help="one skill's SKILL.md and its files",
                      description="The skill a session on the folder would load under NAME "
                      "(the project's when it has one), its SKILL.md text and its files.")
    s.add_argument("name", metavar="NAME")
    s.add_argument("-t", "--target", metavar="DIR", help="the folder (default: machine skills only)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s = ps.add_parser("add", help="install a skill folder as a machine skill",
                      description="Copy the folder at PATH (holding a SKILL.md) into "
                      "OVERLORD_HOME/skills/NAME/, NAME from its front matter. Refused, with "
                      "nothing changed, when it holds no SKILL.md, the SKILL.md is malformed, a "
                      "machine skill of that name is installed, or it holds a symlink. Recorded "
                      "on the audit chain (skill.add).")
    s.add_argument("path", metavar="PATH", help="a skill folder (or its SKILL.md)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s = ps.add_parser("new", help="scaffold a project skill in a folder",
                      description="Write .overlord/skills/NAME/SKILL.md in the folder (the real "
                      "one: a person's act) with front matter to fill in. Refused when it exists "
                      "or a component on the way is a symlink.")
    s.add_argument("name", metavar="NAME")
    s.add_argument("-t", "--target", metavar="DIR", help="the folder (default: .)")
    s.add_argument("-d", "--description", metavar="TEXT", help="its one-line description")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s = ps.add_parser("rm", help="uninstall a machine skill",
                      description="Remove OVERLORD_HOME/skills/NAME/ (recorded on the audit "
                      "chain: skill.remove). A project skill is a file of its folder: delete it "
                      "there.")
    s.add_argument("name", metavar="NAME")
    s.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_skills(args):
    return {"list": _list, "show": _show, "add": _add, "new": _new,
            "rm": _rm}[args.skills_command](args)


def _status(row):
    if row["shadowed"]:
        return "shadowed"
    if row["allowed"] is False:
        return "not allowed"
    return "offered" if row["allowed"] else "installed"


def _list(args):
    view = ops.skills_list(args.target)
    if args.json:
        R.dump_json(jsonable(view))
        return 0
    if view["target"]:
        print(f"skills for {R.escape_path(view['target'])} (policy skills: "
              f"{_policy(view['policy'])})")
    else:
        print(f"machine skills in {R.escape_path(view['machine_dir'])} (pass -t DIR for a "
              "folder's project skills and policy)")
    rows = [(r["name"], r["source"], _status(r), R.escape_text(r["description"]))
            for r in view["skills"]]
    print(R.table([("NAME", "SOURCE", "STATUS", "DESCRIPTION")] + rows) if rows else "no skills")
    for w in view["warnings"]:
        print(f"warning: {R.escape_text(w)}")
    return 0


def _policy(value):
    if value == "*":
        return '"*": every machine skill'
    return "[" + ", ".join(R.escape_text(v) for v in value) + "]" if value else "[]: none"


def _show(args):
    skill = ops.skill_show(args.name, args.target)
    if args.json:
        R.dump_json(jsonable(skill))
        return 0
    print(f"skill {skill['name']} ({skill['source']}, {_status(skill)})  "
          f"{R.escape_path(skill['path'])}  sha256 {R.short(skill['sha256'])}")
    print(f"description: {R.escape_text(skill['description'])}")
    if skill.get("when"):
        print(f"when: {R.escape_text(skill['when'])}")
    print()
    print(R.escape_block(skill["text"]).rstrip("\n"))
    print()
    if skill["files"]:
        print("files:")
        print(R.table([("  " + R.escape_path(f["path"]), f"{f['size']} bytes")
                       for f in skill["files"]]))
    else:
        print("files: none beside SKILL.md")
    return 0


def _add(args):
    done = ops.skill_add(args.path, by=R.cli_actor())
    if args.json:
        R.dump_json(jsonable(done))
        return 0
    n = len(done["files"])
    print(f"installed machine skill {done['name']} (sha256 {R.short(done['sha256'])}, "
          f"{n} supporting file{'' if n == 1 else 's'}) in {R.escape_path(done['path'])}")
    return 0


def _new(args):
    done = ops.skill_new(args.name, args.target, description=args.description)
    if args.json:
        R.dump_json(jsonable(done))
        return 0
    print(f"created {R.escape_path(done['path'])}: fill in its description and text; the "
          "next conversation in the folder is offered it")
    return 0


def _rm(args):
    done = ops.skill_remove(args.name, by=R.cli_actor())
    if args.json:
        R.dump_json(jsonable(done))
        return 0
    print(f"removed machine skill {done['name']} ({R.escape_path(done['path'])})")
    return 0


COMMANDS = {"skills": cmd_skills}
