"""The four chat workloads of bench_spec.py: what a user sends, written for
this benchmark (no text here is taken from elsewhere).

Three of them make the model copy from its prompt, which is where drafting
from the context (n-gram lookup) has something to find; the story copies
nothing, so it shows what each method costs when its drafts miss.
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

# A support agent one tool round into a conversation, then asked to report
# what the second tool returned: the answer repeats its fields.
AGENT_TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_order",
        "description": "Look up an order of the bookshop by its number.",
        "parameters": {"type": "object", "properties": {
            "order_id": {"type": "string", "description": "the order number"}},
            "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "track_parcels",
        "description": "Tracking events of the parcels of an order.",
        "parameters": {"type": "object", "properties": {
            "order_id": {"type": "string"}}, "required": ["order_id"]}}},
]

ORDER_RESULT = {
    "order_id": "B-20417", "placed": "2026-11-18", "customer": "R. Okonkwo",
    "status": "partly shipped",
    "lines": [
        {"title": "A Field Guide to Mosses of the Northern Coast", "qty": 1, "price": 24.50,
         "parcel": "P1"},
        {"title": "Knots for Sailors and Climbers", "qty": 2, "price": 11.00, "parcel": "P1"},
        {"title": "The Slow Kitchen: Forty Winter Soups", "qty": 1, "price": 31.00,
         "parcel": "P2"},
        {"title": "Night Sky Atlas, 3rd edition", "qty": 1, "price": 42.75, "parcel": "P3"},
    ],
    "shipping_address": "14 Orchard Lane, Upper Brindle, BR4 7QT",
}

TRACKING_RESULT = {
    "order_id": "B-20417",
    "parcels": [
        {"parcel": "P1", "carrier": "Brindle Post", "tracking": "BP-7734-2291-06",
         "events": [
             {"at": "2026-11-19 16:02", "where": "Bexford depot", "what": "collected"},
             {"at": "2026-11-20 08:41", "where": "Upper Brindle", "what": "out for delivery"},
             {"at": "2026-11-20 13:15", "where": "14 Orchard Lane", "what": "delivered, left with neighbour at number 12"}]},
        {"parcel": "P2", "carrier": "Swiftline", "tracking": "SWL0049188374",
         "events": [
             {"at": "2026-11-21 10:30", "where": "Carrow hub", "what": "collected"},
             {"at": "2026-11-23 07:55", "where": "Carrow hub", "what": "delayed: address could not be verified"}]},
        {"parcel": "P3", "carrier": None, "tracking": None,
         "events": [], "note": "awaiting stock from publisher, expected to ship 2026-12-04"},
    ],
}

AGENT_MESSAGES = [
    {"role": "system", "content":
        "You are the customer support assistant of Quayside Books. Use the tools to look "
        "things up; never guess order details. Answer in plain text."},
    {"role": "user", "content": "Hi, my order B-20417 hasn't all arrived. What's going on?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "lookup_order", "arguments": json.dumps({"order_id": "B-20417"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(ORDER_RESULT, indent=1)},
    {"role": "assistant", "content":
        "Your order B-20417 is partly shipped: it was split into three parcels (P1, P2 and "
        "P3). Would you like me to check where each parcel is?"},
    {"role": "user", "content":
        "Yes please. For every parcel tell me the carrier, the tracking number, which books "
        "are in it, and its latest tracking event word for word."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {
            "name": "track_parcels", "arguments": json.dumps({"order_id": "B-20417"})}}]},
    {"role": "tool", "tool_call_id": "call_2", "content": json.dumps(TRACKING_RESULT, indent=1)},
]

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
    "agent": {"what": "agent turn after tool results",
              "messages": AGENT_MESSAGES, "tools": AGENT_TOOLS},
    "story": {"what": "free story (nothing to copy)", "messages": STORY_MESSAGES},
}

# The warm-up request: short, and sharing no prefix beyond the chat
# template's with the measured ones.
WARMUP = {"messages": [{"role": "user", "content": "Name three colours."}]}
