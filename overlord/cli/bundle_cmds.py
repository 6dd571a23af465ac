"""`overlord export SID -o FILE.ovl`, `overlord import FILE.ovl [-t DIR]`, `overlord bundle key`:
a session as one signed file that travels to another machine. docs/BUNDLES.md.
"""
from overlord.cli import render as R

WHERE = ("The key is OVERLORD_HOME/bundle.key (0600); an imported record lands in "
         "OVERLORD_HOME/sessions/<sid>. docs/BUNDLES.md.")


def add_parsers(sub):
    """Register this module's subcommands on the main parser's subparsers."""
    e = sub.add_parser("export", help="write a session as a signed .ovl bundle",
                       description="Write one session as a signed bundle (a tar.gz): its record "
                       "(meta, transcript, provenance, review verdicts, what a commit kept), the "
                       "retained file versions its provenance names (so blame works where it "
                       "lands), and for a pending session every change commit would make (file "
                       "contents and modes, symlinks, directories, deletions). A manifest hashes "
                       "every member and is HMAC-signed with this machine's bundle key, made on "
                       "first export. Audited bundle.export. " + WHERE)
    e.add_argument("sid", metavar="SID", help=R.SID_HELP)
    e.add_argument("-o", "--output", required=True, metavar="FILE.ovl",
                   help="the bundle to write (replaced if it exists)")
    e.add_argument("--json", action="store_true", help="machine-readable output")
    i = sub.add_parser("import", help="bring a session's bundle onto this machine",
                       description="Verify a bundle and keep its record here: every member is "
                       "checked against the manifest, the manifest's signature against this "
                       "machine's bundle key (a bundle signed with another key, or none, is "
                       "marked unverified; one naming this machine's key whose signature does "
                       "not match is refused as forged). Extraction is strict: known names only, "
                       "files, directories and (as data) symlinks, size caps "
                       "(OVERLORD_BUNDLE_MAX, OVERLORD_BUNDLE_MEMBER_MAX). A record that was open "
                       "there lands as state `imported`. With -t DIR its changes are replayed as "
                       "a new pending session on DIR (one savepoint with an `import` cause): "
                       "review, diff and commit it as any other. Audited bundle.import. " + WHERE)
    i.add_argument("bundle", metavar="FILE.ovl", help="the bundle to import")
    i.add_argument("-t", "--target", metavar="DIR",
                   help="also replay the bundle's pending changes as a new session on DIR")
    i.add_argument("--require-signature", action="store_true",
                   help="refuse a bundle this machine's key does not verify")
    i.add_argument("--backend", choices=("kernel", "fuse"), help="the backend of the replay session")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    b = sub.add_parser("bundle", help="the machine's bundle signing key",
                       description="The key bundles are signed and verified with. Share it "
                       "between machines that trust each other's bundles: copy the file "
                       "(--show-path) over a channel you trust and install it on the other with "
                       "--import. " + WHERE)
    bs = b.add_subparsers(dest="bundle_command", metavar="ACTION", parser_class=type(b))
    bs.required = True
    k = bs.add_parser("key", help="show the key's fingerprint, its path, or install another's",
                      description="Without options: the key's fingerprint (made if there is "
                      "none yet). --show-path: where the key file is. --import FILE: install "
                      "another machine's key file (64 hex digits) as this machine's, replacing "
                      "the current one (audited bundle.key with both fingerprints, never the "
                      "key). " + WHERE)
    g = k.add_mutually_exclusive_group()
    g.add_argument("--show-path", action="store_true", help="print the key file's path")
    g.add_argument("--import", dest="import_from", metavar="FILE",
                   help="install this key file as the machine's bundle key")
    k.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_export(args):
    from overlord import ops
    sid = ops.resolve_sid(args.sid)
    info = ops.export_session(sid, args.output)
    if args.json:
        R.dump_json(info)
        return 0
    ch = info.get("changes")
    what = (f"{ch['files']} path{'' if ch['files'] == 1 else 's'} written, {ch['deleted']} "
            f"deletion{'' if ch['deleted'] == 1 else 's'}" if ch else f"{info['state']} record")
    print(f"exported session {sid} ({what}) to {R.escape_path(info['path'])}")
    print(f"  {info['members']} members, {info['bytes']:,} bytes, sha256 {info['sha256']}")
    print(f"  signed with bundle key {info['key_id']}")
    return 0


def cmd_import(args):
    from overlord import ops
    res = ops.import_bundle(args.bundle, target=args.target,
                            require_signature=args.require_signature, backend=args.backend)
    if args.json:
        R.dump_json(res)
        return 0
    mark = "verified" if res["verified"] else "UNVERIFIED"
    if res.get("record") == "present":
        print(f"replayed the bundle of session {res['sid']} from "
              f"{R.escape_text(str(res['host']))} ({mark}: {R.escape_text(res['why'])})")
        print(f"  the record of session {res['sid']} is already here (state {res['state']}); "
              f"left as it is, replayed from the bundle, sha256 {res['bundle_sha256']}")
    else:
        print(f"imported session {res['sid']} from {R.escape_text(str(res['host']))} ({mark}: "
              f"{R.escape_text(res['why'])})")
        print(f"  state {res['state']}"
              + (f" (was {res['original_state']})" if res["state"] != res["original_state"] else "")
              + f", bundle sha256 {res['bundle_sha256']}")
    if res["new_sid"]:
        print(f"session {res['new_sid']}  pending on {R.escape_path(res['target'])}: "
              f"{R.escape_text(res['changes'])} (review: overlord diff {res['new_sid']})")
    elif res["changes"]:
        print(f"  its changes ({R.escape_text(res['changes'])}) are kept with the record; "
              f"replay them with: overlord import FILE -t DIR")
    return 0


def cmd_bundle(args):
    from overlord import ops
    res = ops.bundle_key(show_path=args.show_path, import_from=args.import_from)
    if args.json:
        R.dump_json(res)
        return 0
    if args.show_path:
        print(R.escape_path(res["path"]))
        return 0
    if res.get("imported"):
        was = f" (replacing {res['previous']})" if res.get("previous") else ""
        print(f"bundle key installed: {res['fingerprint']}{was}")
        return 0
    print(res["fingerprint"] + ("  (made now)" if res.get("made") else ""))
    return 0


COMMANDS = {"export": cmd_export, "import": cmd_import, "bundle": cmd_bundle}
