#!/usr/bin/env python3
"""Independent verifier of mindxtrain receipt bundles, written from docs/formats.md
("Manifest" and "Receipt bundle") alone. Offline checks only; uses hashlib, blake3, PyNaCl.

usage: verify_receipt.py RECEIPT [--files DIR] [--config RECIPE] [--plan PLAN]
                         [--trusted-key HEX|FILE] [--json]
--trusted-key: 64 hex digits, or a file holding them (a node's node.pub).
exit: 0 every check passed; 3 something does not match; 4 an input is missing or unreadable.
"""

import argparse
import base64
import hashlib
import json
import os
import sys

import blake3
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_V1 = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://mindxtrain.dev/buildtypes/train/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
EVENT_CONTEXT = b"mindxtrain/event/v1\n"


def b3(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def ed25519_ok(key: bytes, msg: bytes, sig: bytes) -> bool:
    try:
        VerifyKey(key).verify(msg, sig)
        return True
    except (BadSignatureError, ValueError):
        return False


def canonical_strings(obj) -> bytes:
    # RFC 8785 for a JSON value made of objects, arrays and strings only (the DSSE
    # envelope): sorted members, no whitespace, minimal escapes, UTF-8.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def leaf_hash(item: bytes) -> bytes:
    return b3(b"\x00" + item)


def node_hash(left: bytes, right: bytes) -> bytes:
    return b3(b"\x01" + left + right)


def root_from_inclusion(leaf: bytes, index: int, size: int, proof) -> bytes:
    # RFC 9162 section 2.1.3.2.
    if index >= size:
        raise ValueError("index outside the tree")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ValueError("proof too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while fn & 1 == 0 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ValueError("proof too short")
    return r


def hex32(text) -> bytes:
    if not isinstance(text, str) or len(text) != 64:
        raise ValueError("not 64 hex digits")
    return bytes.fromhex(text)


def log_origin(key: bytes) -> str:
    return "mindxtrain/" + hashlib.sha256(key).hexdigest()[:16]


def verify_note(note: str, key: bytes):
    """C2SP signed note; returns (origin, size, root) or raises ValueError."""
    body, sep, sigs = note.partition("\n\n")
    if not sep:
        raise ValueError("no blank line in the checkpoint")
    body += "\n"
    lines = body.split("\n")
    origin, size, root = lines[0], int(lines[1]), base64.b64decode(lines[2], validate=True)
    if len(root) != 32:
        raise ValueError("root is not 32 bytes")
    key_id = hashlib.sha256(origin.encode() + b"\n" + b"\x01" + key).digest()[:4]
    for line in sigs.splitlines():
        if not line.startswith("\u2014 "):
            raise ValueError("signature line without an em dash")
        name, _, b64 = line[2:].partition(" ")
        raw = base64.b64decode(b64)
        if name == origin and len(raw) == 68 and raw[:4] == key_id:
            if not ed25519_ok(key, body.encode(), raw[4:]):
                raise ValueError("checkpoint signature does not verify")
            if origin != log_origin(key):
                raise ValueError("origin %s is not the signer's log" % origin)
            return origin, size, root
    raise ValueError("no signature by the signer's key on the checkpoint")


class Report:
    def __init__(self):
        self.checks = []

    def add(self, name, status, detail=""):
        self.checks.append({"name": name, "status": status, "detail": detail})

    def run(self, name, fn):
        try:
            self.add(name, "pass", fn() or "")
        except Exception as e:  # every failure becomes a named line
            self.add(name, "fail", str(e))

    def exit_code(self):
        statuses = {c["status"] for c in self.checks}
        return 3 if "fail" in statuses else 4 if "missing" in statuses else 0


def digests_match(data: bytes, digest: dict):
    if digest.get("sha256") != sha256(data).hex() or digest.get("blake3") != b3(data).hex():
        raise ValueError("sha256/blake3 differ from the manifest")


def safe_name(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def carries(st: dict, item: str) -> bool:
    """Whether the statement holds the part of a receipt.include item (docs/formats.md, "Manifest")."""
    bd, rd = st["predicate"]["buildDefinition"], st["predicate"]["runDetails"]
    deps = [d.get("name") for d in bd.get("resolvedDependencies", [])]
    parts = {
        "recipe_hash": True,
        "dataset_hashes": "dataset" in deps,
        "code_version": bool(rd["builder"].get("version")) or "source" in deps,
        "hardware": rd.get("mindxtrain_hardware") is not None,
        "plan": bd["internalParameters"].get("plan") is not None,
        "eval_report": any(b.get("name") == "eval.json" for b in rd.get("byproducts", [])),
        "energy_kwh": "mindxtrain_energy" in rd,
        "event_log": "mindxtrain_log" in rd,
        "checkpoints": any(x["name"].startswith("checkpoints/") for x in st["subject"]),
    }
    return parts.get(item, False)


def verify(receipt: dict, files, config, plan, trusted_key):
    rep = Report()
    env = receipt["manifest"]
    env_bytes = canonical_strings(env)
    digest_b3, digest_sha = b3(env_bytes), sha256(env_bytes)
    key = trusted_key if trusted_key else hex32(env["signatures"][0]["keyid"])
    payload = base64.b64decode(env["payload"], validate=True)

    def manifest_signature():
        for s in env["signatures"]:
            if s["keyid"].lower() == key.hex():
                if ed25519_ok(key, pae(env["payloadType"], payload), base64.b64decode(s["sig"])):
                    return "signed by " + key.hex()
                raise ValueError("DSSE signature does not verify")
        raise ValueError("no signature by " + key.hex())

    rep.run("manifest.signature", manifest_signature)
    st = json.loads(payload)

    def statement():
        if env["payloadType"] != PAYLOAD_TYPE or st["_type"] != STATEMENT_TYPE or st["predicateType"] != SLSA_V1:
            raise ValueError("not an in-toto v1 SLSA provenance v1 statement")
        if st["predicate"]["buildDefinition"]["buildType"] != BUILD_TYPE:
            raise ValueError("not a mindxtrain build type")
        return "run " + st["predicate"]["runDetails"]["metadata"]["invocationId"]

    rep.run("manifest.statement", statement)
    details = st["predicate"]["runDetails"]
    items = details.get("mindxtrain_receipt")
    omitted = items["omitted"] if items else []
    if items is None:
        rep.add("manifest.include", "skipped", "sealed before receipt.include was recorded: every item")
    else:

        def include():
            carried = [i for i in omitted if carries(st, i)]
            if carried:
                raise ValueError("receipt.include left out %s, but the manifest carries it" % ", ".join(carried))
            if not omitted:
                return "every item"
            return "left out by the recipe's receipt.include: " + ", ".join(omitted)

        rep.run("manifest.include", include)
    pos = details.get("mindxtrain_log")

    def sealed_checkpoint():
        _, size, _ = verify_note(pos["checkpoint"], key)
        if not pos["firstSeq"] <= pos["lastSeq"] < size:
            raise ValueError("run events are not inside the checkpoint")

    if pos is None:
        rep.add("manifest.log_checkpoint", "skipped", "left out by receipt.include (event_log)")
    else:
        rep.run("manifest.log_checkpoint", sealed_checkpoint)

    if files:
        named = [(s["name"], s["digest"], True) for s in st["subject"]]
        for b in st["predicate"]["runDetails"].get("byproducts", []):
            if b.get("name") == "eval.json" and all(n != "eval.json" for n, _, _ in named):
                named.append(("eval.json", b["digest"], False))
        for name, digest, required in named:
            label = "file:" + name
            if not safe_name(name):
                rep.add(label, "fail", "unsafe name")
                continue
            path = os.path.join(files, *name.split("/"))
            if not os.path.isfile(path):
                rep.add(label, "missing" if required else "skipped", path + " not found")
                continue
            with open(path, "rb") as fh:
                data = fh.read()
            rep.run(label, lambda data=data, digest=digest: digests_match(data, digest))
    else:
        rep.add("files", "skipped", "no --files")

    bd = st["predicate"]["buildDefinition"]
    for name, param, given in (
        ("recipe", bd["externalParameters"]["recipe"], config),
        ("plan", bd["internalParameters"].get("plan"), plan),
    ):
        if param is None and name in omitted:
            rep.add(name, "skipped", "left out by receipt.include (its file is a subject, checked with --files)")
        elif given is None:
            rep.add(name, "skipped", "not given")
        elif param is None:
            rep.add(name, "fail", "the manifest records no " + name)
        elif not os.path.isfile(given):
            rep.add(name, "missing", given + " not found")
        else:
            with open(given, "rb") as fh:
                data = fh.read()
            rep.run(name, lambda data=data, param=param: digests_match(data, param["digest"]))

    ev = receipt["event"]
    ev_bytes = ev["envelope"].encode("utf-8")
    ev_hash = b3(ev_bytes)

    def event_digest():
        e = json.loads(ev_bytes)
        if e["kind"] != "manifest.sealed" or e["seq"] != ev["seq"]:
            raise ValueError("not the manifest.sealed event at seq %d" % ev["seq"])
        if e["data"]["blake3"] != digest_b3.hex() or e["data"]["sha256"] != digest_sha.hex():
            raise ValueError("the event records another manifest digest")
        if e["subject"] != st["predicate"]["runDetails"]["metadata"]["invocationId"]:
            raise ValueError("the event is for another run")

    rep.run("event.manifest_digest", event_digest)

    def event_signature():
        if not ed25519_ok(key, EVENT_CONTEXT + ev_hash, bytes.fromhex(ev["sig"])):
            raise ValueError("event signature does not verify")

    rep.run("event.signature", event_signature)
    cp = {}

    def checkpoint():
        cp["origin"], cp["size"], cp["root"] = verify_note(receipt["checkpoint"], key)
        return "%d events" % cp["size"]

    rep.run("log.checkpoint", checkpoint)

    def inclusion():
        if not cp:
            raise ValueError("no verified checkpoint")
        proof = [hex32(h) for h in receipt["inclusion"]]
        if root_from_inclusion(leaf_hash(ev_hash), ev["seq"], cp["size"], proof) != cp["root"]:
            raise ValueError("inclusion proof does not reach the checkpoint root")

    rep.run("log.inclusion", inclusion)

    anchor = receipt.get("anchor")
    if anchor is None:
        rep.add("anchor.batch_proof", "skipped", "not anchored")
    else:

        def batch():
            if anchor["v"] != 1 or hex32(anchor["digest"]) != digest_b3:
                raise ValueError("the batch proof is not for this manifest")
            proof = [hex32(h) for h in anchor["proof"]]
            got = root_from_inclusion(leaf_hash(digest_b3), anchor["leaf_index"], anchor["tree_size"], proof)
            if got != hex32(anchor["root"]):
                raise ValueError("batch proof does not reach the anchored root")
            return "root %s on chain %d block %d" % (anchor["root"], anchor["chain_id"], anchor["block"])

        rep.run("anchor.batch_proof", batch)
    return rep, digest_b3.hex()


def read_trusted_key(arg: str) -> bytes:
    """The pinned key: 64 hex digits, or a file (node.pub) holding them. ValueError names the input."""
    text = arg
    if os.path.isfile(arg):
        try:
            with open(arg, encoding="ascii") as fh:
                text = fh.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError("--trusted-key %s: %s" % (arg, e))
    if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise ValueError("--trusted-key %s: neither 64 hex digits nor a file holding them (node.pub)" % arg)
    return bytes.fromhex(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("receipt")
    ap.add_argument("--files")
    ap.add_argument("--config")
    ap.add_argument("--plan")
    ap.add_argument("--trusted-key")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        trusted_key = read_trusted_key(a.trusted_key) if a.trusted_key else None
    except ValueError as e:
        print("error: %s" % e, file=sys.stderr)
        return 4
    try:
        with open(a.receipt, "rb") as fh:
            receipt = json.loads(fh.read())
    except OSError as e:
        print("error: %s" % e, file=sys.stderr)
        return 4
    except ValueError as e:
        print("FAIL receipt.format %s" % e)
        return 3
    try:
        rep, digest = verify(receipt, a.files, a.config, a.plan, trusted_key)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        print("FAIL receipt.format malformed bundle: %r" % e)
        return 3
    code = rep.exit_code()
    if a.json:
        print(json.dumps({"ok": code == 0, "exit_code": code, "manifest_blake3": digest, "checks": rep.checks}))
    else:
        for c in rep.checks:
            print("%-8s %-22s %s" % (c["status"].upper(), c["name"], c["detail"]))
        print("VERIFIED" if code == 0 else "NOT VERIFIED")
    return code


if __name__ == "__main__":
    sys.exit(main())
