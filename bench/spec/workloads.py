"""The chat workloads of bench_spec.py: what a user sends, written for this
benchmark (no text here is taken from elsewhere).

rag and code make the model copy from its prompt, which is where drafting
from the context has something to find; agent_loop (ten requests, each
resending the history with the last tool call and its result) and repeat4
(one prompt sent as four fresh conversations) give it earlier turns and
earlier requests to copy; the story copies nothing, so it shows what each
method costs when its drafts miss.
"""
import json

# A policy document of a made-up water utility: long enough (~900 tokens)
# that the prompt, not the answer, is most of the request, and written in
# sentences the question asks to quote verbatim.
RAG_DOCUMENT = """\
Larkspur Valley Water Cooperative - Drought Operations Plan, revision 7

1. Purpose. This plan tells members, staff and the board what the cooperative does when \
the reservoirs run low. It replaces revision 6 and takes effect on the first day of the \
month after the board adopts it. Where this plan and an older notice disagree, this plan \
wins.

2. Measuring supply. The operations desk reads the levels of the North Basin and Cedar \
Fork reservoirs every morning at seven and publishes the combined figure as a percentage \
of full capacity. The drought stage is set from the average of the last fourteen daily \
readings, not from any single day, so that one dry week or one storm does not move the \
stage by itself. A change of stage is announced on the cooperative's website, by text \
message to every member who has signed up for alerts, and on the notice board outside \
the Mill Street office.

3. Stage 1 (watch). Stage 1 begins when the fourteen-day average falls below 70 percent. \
During Stage 1 the cooperative asks members to water gardens only before nine in the \
morning or after six in the evening. No fines are issued in Stage 1. Staff check the \
largest hundred meters every week and call any member whose use has doubled since the \
same month last year.

4. Stage 2 (warning). Stage 2 begins when the fourteen-day average falls below 55 \
percent. During Stage 2 outdoor watering with sprinklers is allowed on two days a week, \
assigned by the last digit of the street address: even numbers water on Tuesday and \
Saturday, odd numbers on Wednesday and Sunday. Filling a private swimming pool from the \
mains requires a permit, and permits are granted only for pools that were emptied for \
repair. Car washing at home is allowed with a bucket or a hose that has a shut-off \
nozzle. A first breach of the Stage 2 rules earns a written warning; a second breach \
within ninety days earns a fine of 75 dollars.

5. Stage 3 (emergency). Stage 3 begins when the fourteen-day average falls below 40 \
percent, or at once if the state declares a water emergency for the county. During \
Stage 3 all outdoor watering with sprinklers is banned, and hand watering of vegetable \
gardens and young trees is allowed for one hour on Saturdays. No new pool permits are \
issued, and permits already granted are suspended. Every breach of the Stage 3 rules \
earns a fine of 250 dollars, and a member who breaches them three times may have a flow \
restrictor fitted to the meter at the member's own cost. The board meets every two weeks \
for as long as Stage 3 lasts.

6. Exemptions. The rules of Stages 2 and 3 do not apply to water used to fight fires, to \
water used by hospitals, clinics and care homes, or to water that a licensed farm uses \
for livestock. A member who needs water for a medical device at home may apply for an \
exemption, which the general manager decides within five working days. Exemptions are \
never granted for lawns, ornamental fountains or decorative ponds.

7. Ending a stage. A stage ends only when the fourteen-day average has stayed above the \
threshold of the stage below for thirty days in a row. The cooperative never moves down \
two stages at once: after Stage 3 ends, Stage 2 applies for at least thirty days before \
Stage 1 can begin.

8. Appeals. A member who believes a fine was issued in error may appeal in writing within \
twenty-one days. Appeals are heard by a panel of two board members and one member of \
the public chosen by lot. The fine is not payable while an appeal is open.
"""

RAG_QUESTION = (
    "Using only the document above, answer: what may a member with an odd street number "
    "do in Stage 2, what changes in Stage 3, and who is exempt? Quote the exact sentences "
    "of the document that say so, each in quotation marks, in the order they appear, and "
    "then give a two-sentence summary.")

# A small, ordinary module a user might paste and ask to have touched up:
# the answer reproduces almost all of it with small edits.
CODE_SOURCE = '''\
import csv
from datetime import date


def load_stock(path):
    d = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            sku = row["sku"].strip()
            qty = int(row["quantity"])
            if sku in d:
                d[sku]["quantity"] += qty
            else:
                d[sku] = {"name": row["name"], "quantity": qty,
                          "reorder_at": int(row.get("reorder_at") or 0)}
    return d


def needs_reorder(d, today=None):
    today = today or date.today()
    out = []
    for sku, item in sorted(d.items()):
        if item["quantity"] <= item["reorder_at"]:
            out.append((sku, item["name"], item["reorder_at"] - item["quantity"] + 1))
    return out


def apply_sales(d, sales):
    missing = []
    for sku, sold in sales:
        if sku not in d:
            missing.append(sku)
            continue
        d[sku]["quantity"] = max(0, d[sku]["quantity"] - sold)
    return missing


def report(d, today=None):
    lines = ["Stock report for %s" % (today or date.today()).isoformat()]
    for sku, name, short in needs_reorder(d, today):
        lines.append("  reorder %s (%s): at least %d" % (sku, name, short))
    if len(lines) == 1:
        lines.append("  nothing to reorder")
    return "\\n".join(lines)
'''

CODE_REQUEST = (
    "Here is a Python module:\n\n```python\n" + CODE_SOURCE + "```\n\n"
    "Rename the variable `d` to `stock_by_sku` everywhere, and add type hints to every "
    "function's parameters and return value. Change nothing else. Reply with the complete "
    "updated module in one Python code block and no explanation.")

# The agent loop: an inventory agent with three tools and a task of ten
# calls (get, then update, for each of five records), one call a turn. The
# script (bench_spec.py) plays the agent framework: it appends the
# assistant's call and the tool's result (agent_tool_result below, a pure
# function of the call) and resends the whole history. Every update copies
# a field of the record the call before fetched, and every call is shaped
# like the ones before it: what an agent's turns give speculation to copy.
AGENT_TOOLS = [
    {"type": "function", "function": {
        "name": "get_record",
        "description": "Fetch one stock record of the warehouse by its id.",
        "parameters": {"type": "object", "properties": {
            "record_id": {"type": "integer", "description": "the record's id, 1 to 99"}},
            "required": ["record_id"]}}},
    {"type": "function", "function": {
        "name": "update_record",
        "description": "Set the review status and note of a stock record.",
        "parameters": {"type": "object", "properties": {
            "record_id": {"type": "integer"},
            "status": {"type": "string", "description": "the new status"},
            "note": {"type": "string", "description": "the note to store with the record"}},
            "required": ["record_id", "status", "note"]}}},
    {"type": "function", "function": {
        "name": "send_report",
        "description": "Send the finished review to the warehouse manager.",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string"}}, "required": ["text"]}}},
]

AGENT_LOOP_TURNS = 10

AGENT_LOOP_MESSAGES = [
    {"role": "system", "content":
        "You are the stock review agent of the Harbourside warehouse. You act only through "
        "the tools, one call at a time: each reply is the single next tool call and nothing "
        "else. After each call, wait: the next message brings its result, and you cannot "
        "know it before. Never write two calls in one reply."},
    {"role": "user", "content":
        "Review stock records 1 to 5, in order. For each record, first call get_record with "
        "its record_id; then, once you have its result, call update_record with the same "
        "record_id, status \"reviewed\", and note set to the record's summary, copied "
        "exactly from the result. When all five records are updated, call send_report with a "
        "one-line summary. Make the first call now."},
]

_ITEMS = ["galvanised wall brackets", "oak dowels 8 mm", "nitrile gloves, large",
          "stainless hinge pins", "brass cabinet knobs", "cedar shingles", "copper pipe elbows",
          "jute twine 3-ply", "rubber door stops", "linseed oil 1 l"]
_PLACES = ["aisle 3, bay 12", "aisle 7, bay 2", "mezzanine shelf B", "cold store rack 4",
           "aisle 1, bay 9", "yard cage 2", "aisle 5, bay 6"]


def agent_record(n):
    """Stock record n: made up, deterministic."""
    qty = (n * 37) % 120 + 4
    reorder = (n * 13) % 40 + 10
    item = _ITEMS[(n - 1) % len(_ITEMS)]
    place = _PLACES[(n * 3) % len(_PLACES)]
    state = "below its reorder level" if qty <= reorder else "above its reorder level"
    return {"record_id": n, "sku": "HW-%05d" % (4100 + n * 7), "item": item,
            "quantity": qty, "reorder_level": reorder, "location": place,
            "last_counted": "2026-11-%02d" % (3 + n * 4 % 25),
            "summary": "%d x %s at %s, %s (%d); last counted 2026-11-%02d." % (
                qty, item, place, state, reorder, 3 + n * 4 % 25)}


def agent_tool_result(name, arguments):
    """The tool's answer to a call: JSON text, a pure function of the call
    (name, arguments as the JSON text the server returned), so every engine
    and method that made the same call gets the same result."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
        if not isinstance(args, dict):
            raise ValueError
    except ValueError:
        return json.dumps({"error": "arguments are not a JSON object"})
    rid = args.get("record_id")
    if isinstance(rid, str) and rid.strip().isdigit():
        rid = int(rid)
    if name in ("get_record", "update_record") and not (isinstance(rid, int) and 1 <= rid <= 99):
        return json.dumps({"error": "no record with record_id %r" % (rid,)})
    # next_step: the hint an agent-facing tool gives (it keeps a small model
    # on the task's order instead of inventing results)
    if name == "get_record":
        return json.dumps(dict(agent_record(rid), next_step=(
            "call update_record with record_id %d, status \"reviewed\" and note set to this "
            "summary" % rid)))
    if name == "update_record":
        return json.dumps({"ok": True, "record_id": rid, "status": args.get("status"),
                           "note_stored": len(str(args.get("note") or "")) > 0,
                           "updated_at": "2026-12-02T10:%02d:00Z" % (rid * 7 % 60),
                           "next_step": "call get_record with record_id %d" % (rid + 1)
                           if rid < 5 else "call send_report"})
    if name == "send_report":
        return json.dumps({"ok": True, "sent_to": "warehouse manager"})
    return json.dumps({"error": "unknown tool %r" % (name,)})


# The same task in four fresh sessions: four separate requests with the same
# prompt, as four users (or four runs of one script) would send it.
REPEAT_TASK = (
    "Write a Python function `merge_intervals(intervals)` that takes a list of (start, end) "
    "pairs and returns the sorted list of merged, non-overlapping intervals. Give it type "
    "hints and a docstring with an example, then three pytest tests for it.")

STORY_MESSAGES = [
    {"role": "user", "content":
        "Write a new short story, about 400 words, about an apprentice clockmaker in a "
        "mountain town who finds a clock that runs a few minutes ahead of the future. Give "
        "it a title, vivid detail, and an ending the reader does not see coming."},
]

WORKLOADS = {
    "rag": {"what": "RAG answer quoting its document",
            "messages": [{"role": "user", "content":
                          "Document:\n\n" + RAG_DOCUMENT + "\n" + RAG_QUESTION}]},
    "code": {"what": "code edit (rename + type hints)",
             "messages": [{"role": "user", "content": CODE_REQUEST}]},
    # multi-request: AGENT_LOOP_TURNS requests, each resending the history
    "agent_loop": {"what": "agent loop, %d turns of JSON tool calls" % AGENT_LOOP_TURNS,
                   "messages": AGENT_LOOP_MESSAGES, "tools": AGENT_TOOLS,
                   # the model must call a tool, one a reply (it writes all ten
                   # at once, made-up results included, when left to "auto")
                   "tool_choice": "required", "parallel_tool_calls": False,
                   "loop": AGENT_LOOP_TURNS},
    # multi-request: the same prompt as `repeat` fresh conversations
    "repeat4": {"what": "the same task in 4 fresh sessions",
                "messages": [{"role": "user", "content": REPEAT_TASK}], "repeat": 4},
    "story": {"what": "free story (nothing to copy)", "messages": STORY_MESSAGES},
}

# The warm-up request: short, and sharing no prefix beyond the chat
# template's with the measured ones.
WARMUP = {"messages": [{"role": "user", "content": "Name three colours."}]}
