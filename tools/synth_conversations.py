#!/usr/bin/env python3
"""Synthetic chat conversations for lily-tiny (models/lily-tiny), deterministic from a seed.

Every conversation is a list of OpenAI-style messages (plus an optional `tools` list and an
`enable_thinking` flag). It is rendered with the Qwen3.6 chat template
(tools/qwen36_chat_template.jinja) through jinja2 in the environment transformers uses
(sandboxed, trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`, a json.dumps
`tojson` with ensure_ascii=False). `segments()` cuts the rendered text into
(text, is_loss) pieces: the loss pieces are exactly what the model must generate after
each generation prompt (`<|im_start|>assistant\\n<think>\\n` with thinking on,
`...<think>\\n\\n</think>\\n\\n` with thinking off) up to and including `<|im_end|>`.
Only assistant turns after the last real user query are trained on (the ones the template
renders with their think block, i.e. the ones the model generates at inference).

Task families:
  arith     two-number addition / subtraction, operands 0-999, several phrasings; the worked
            solution peels off the last digits column by column (add_work / sub_work): in the
            reasoning with thinking on, in the answer ("Working it out: ...") with thinking off
  instr     repeat / reverse the word order / uppercase / count words
  copy      repeat an arbitrary text (place names, made-up words, random letters)
  tool      get_weather(city), get_time(city), convert_currency(amount, from, to): emit a
            Qwen XML <tool_call>, then answer from the <tool_response>; questions that need
            no tool are answered directly even when tools are offered; the cities come from
            rand_city (real names of many countries, made-up names, random letter strings,
            multi-word / hyphenated forms), so the argument can only be copied, not guessed
  chat      greetings, identity, and a polite refusal for questions it cannot answer
  multi     a previous exchange in the history, then a new question

Held out from training (for generalisation tests, written to heldout.json by train_tiny.py):
  number pairs with (a*7 + b*13) % 10 == 0 (for both + and -), and the cities in
  HELDOUT_CITIES. Note that (7a + 13b) % 10 == 0 exactly when a and b end in the same digit: no
  training question has equal last digits, so the held-out test asks for digit facts (d+d, d-d)
  in the ones column that training only shows in other columns; the column steps are written so
  that every column looks the same (see add_work).

Standalone use (Debian python3 with python3-jinja2 is enough):
  /usr/bin/python3 tools/synth_conversations.py --show 8 --seed 1     print rendered examples
  /usr/bin/python3 tools/synth_conversations.py --check 2000           self-check
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys

import jinja2
import jinja2.exceptions
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_PATH = os.path.join(HERE, "qwen36_chat_template.jinja")

IM_END = "<|im_end|>"

# --------------------------------------------------------------------------------------------
# Rendering (the transformers chat-template environment)
# --------------------------------------------------------------------------------------------


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def load_template_source(path: str = TEMPLATE_PATH) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def make_template(source: str | None = None):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source if source is not None else load_template_source())


def render(template, messages, tools=None, add_generation_prompt=False, enable_thinking=True):
    kwargs = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
    if not enable_thinking:
        kwargs["enable_thinking"] = False
    return template.render(**kwargs)


def last_query_index(messages) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m["role"] == "user":
            c = (m.get("content") or "").strip()
            if not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
                return i
    raise ValueError("no user query")


def segments(template, ex: dict) -> list[tuple[str, bool]]:
    """Cuts a rendered conversation into (text, is_loss) pieces (see the module doc)."""
    msgs, tools, think = ex["messages"], ex.get("tools"), ex.get("enable_thinking", True)
    full = render(template, msgs, tools, False, think)
    lqi = last_query_index(msgs)
    out: list[tuple[str, bool]] = []
    pos = 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or i <= lqi:
            continue
        prompt = render(template, msgs[:i], tools, True, think)
        upto = render(template, msgs[: i + 1], tools, False, think)
        if not (full.startswith(upto) and upto.startswith(prompt) and upto.endswith(IM_END + "\n")
                and len(prompt) >= pos):
            raise AssertionError("rendering is not prefix-consistent for example %r" % ex.get("kind"))
        out.append((full[pos:len(prompt)], False))
        out.append((full[len(prompt):len(upto) - 1], True))   # completion, ends with <|im_end|>
        pos = len(upto) - 1
    if not out:
        raise AssertionError("example without a trained assistant turn")
    return out


def generation_prompt(template, ex: dict) -> str:
    """The prompt for the model's next turn (the messages of `ex` as they stand)."""
    return render(template, ex["messages"], ex.get("tools"), True, ex.get("enable_thinking", True))


# --------------------------------------------------------------------------------------------
# Vocabulary of the tasks
# --------------------------------------------------------------------------------------------

def is_heldout_pair(a: int, b: int) -> bool:
    return (a * 7 + b * 13) % 10 == 0


TRAIN_CITIES = [
    "Oslo", "Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw",
    "Dublin", "Athens", "Helsinki", "Stockholm", "Copenhagen", "Amsterdam", "Brussels", "Zurich",
    "Geneva", "Munich", "Hamburg", "Milan", "Naples", "Barcelona", "Valencia", "Porto", "Krakow",
    "Budapest", "Bucharest", "Sofia", "Belgrade", "Zagreb", "Riga", "Vilnius", "Kyiv", "Istanbul",
    "Ankara", "Cairo", "Nairobi", "Lagos", "Accra", "Dakar", "Casablanca", "Tunis", "Johannesburg",
    "Cape Town", "Durban", "Addis Ababa", "Kampala", "Dubai", "Doha", "Riyadh", "Tehran", "Baghdad",
    "Karachi", "Lahore", "Delhi", "Mumbai", "Chennai", "Kolkata", "Bangalore", "Dhaka", "Colombo",
    "Bangkok", "Hanoi", "Manila", "Jakarta", "Singapore", "Kuala Lumpur", "Seoul", "Busan", "Tokyo",
    "Osaka", "Kyoto", "Beijing", "Shanghai", "Shenzhen", "Hong Kong", "Taipei", "Sydney",
    "Melbourne", "Perth", "Brisbane", "Auckland", "Wellington", "Toronto", "Montreal", "Vancouver",
    "Ottawa", "Chicago", "Boston", "Seattle", "Denver", "Austin", "Dallas", "Houston", "Miami",
    "Atlanta", "Phoenix", "New York", "Los Angeles", "San Francisco", "San Diego", "Mexico City",
    "Havana", "Bogota", "Lima", "Quito", "Santiago", "Buenos Aires", "Caracas", "La Paz",
    "Sao Paulo", "Rio de Janeiro", "Anchorage", "Honolulu", "Edinburgh", "Glasgow", "Cardiff",
    "Marseille", "Lyon", "Nice", "Seville", "Florence", "Venice", "Salzburg", "Bergen", "Gothenburg",
]
# Never seen in training: tool calls for these test copying an unseen name.
HELDOUT_CITIES = ["Reykjavik", "Montevideo", "Windhoek", "Tallinn", "Kathmandu", "Ljubljana"]

# More real place names (any language; none of them contains a held-out city).
MORE_REAL_CITIES = [
    "Aarhus", "Odense", "Tromso", "Trondheim", "Stavanger", "Uppsala", "Malmo", "Turku", "Tampere",
    "Oulu", "Tartu", "Kaunas", "Klaipeda", "Daugavpils", "Gdansk", "Poznan", "Wroclaw", "Lodz",
    "Szczecin", "Brno", "Ostrava", "Bratislava", "Kosice", "Graz", "Linz", "Innsbruck", "Debrecen",
    "Szeged", "Cluj-Napoca", "Timisoara", "Iasi", "Constanta", "Varna", "Plovdiv", "Skopje",
    "Podgorica", "Sarajevo", "Mostar", "Split", "Dubrovnik", "Rijeka", "Maribor", "Koper",
    "Thessaloniki", "Patras", "Heraklion", "Nicosia", "Limassol", "Valletta", "Izmir", "Antalya",
    "Bursa", "Tbilisi", "Batumi", "Yerevan", "Baku", "Almaty", "Astana", "Tashkent", "Samarkand",
    "Bishkek", "Dushanbe", "Ashgabat", "Ulaanbaatar", "Kabul", "Herat", "Islamabad", "Peshawar",
    "Jaipur", "Pune", "Hyderabad", "Ahmedabad", "Lucknow", "Varanasi", "Chittagong", "Pokhara",
    "Thimphu", "Male", "Yangon", "Mandalay", "Vientiane", "Phnom Penh", "Siem Reap", "Chiang Mai",
    "Da Nang", "Hue", "Cebu", "Davao", "Surabaya", "Bandung", "Medan", "Denpasar", "Makassar",
    "Penang", "Ipoh", "Brunei", "Dili", "Port Moresby", "Suva", "Apia", "Nuku'alofa", "Papeete",
    "Noumea", "Hobart", "Darwin", "Adelaide", "Canberra", "Cairns", "Christchurch", "Dunedin",
    "Hamilton", "Sapporo", "Sendai", "Nagoya", "Kobe", "Hiroshima", "Fukuoka", "Naha", "Incheon",
    "Daegu", "Gwangju", "Pyongyang", "Harbin", "Shenyang", "Dalian", "Qingdao", "Nanjing",
    "Hangzhou", "Suzhou", "Wuhan", "Chengdu", "Chongqing", "Xi'an", "Kunming", "Lhasa", "Urumqi",
    "Guangzhou", "Xiamen", "Macau", "Kaohsiung", "Ulsan", "Vladivostok", "Irkutsk", "Novosibirsk",
    "Yekaterinburg", "Kazan", "Samara", "Volgograd", "Rostov-on-Don", "Sochi", "Murmansk",
    "Arkhangelsk", "Minsk", "Brest", "Lviv", "Odesa", "Kharkiv", "Dnipro", "Chisinau", "Tirana",
    "Durres", "Pristina", "Novi Sad", "Nis", "Oran", "Algiers", "Constantine",
    "Marrakesh", "Fes", "Tangier", "Rabat", "Agadir", "Sfax", "Tripoli", "Benghazi", "Alexandria",
    "Luxor", "Aswan", "Khartoum", "Omdurman", "Asmara", "Djibouti", "Mogadishu", "Hargeisa",
    "Mombasa", "Kisumu", "Arusha", "Dodoma", "Dar es Salaam", "Zanzibar", "Kigali", "Bujumbura",
    "Goma", "Kinshasa", "Brazzaville", "Luanda", "Lusaka", "Harare", "Bulawayo", "Maputo",
    "Lilongwe", "Blantyre", "Gaborone", "Maseru", "Mbabane", "Pretoria", "Bloemfontein",
    "Port Elizabeth", "Antananarivo", "Port Louis", "Abuja", "Kano", "Ibadan", "Lome", "Cotonou",
    "Ouagadougou", "Bamako", "Niamey", "Conakry", "Freetown", "Monrovia", "Abidjan", "Yamoussoukro",
    "Banjul", "Bissau", "Nouakchott", "Praia", "Douala", "Yaounde", "Libreville", "Malabo",
    "N'Djamena", "Bangui", "Juba", "Muscat", "Manama", "Kuwait City", "Abu Dhabi", "Sharjah",
    "Jeddah", "Mecca", "Medina", "Sanaa", "Aden", "Amman", "Beirut", "Damascus", "Aleppo",
    "Jerusalem", "Tel Aviv", "Haifa", "Basra", "Mosul", "Erbil", "Shiraz", "Isfahan", "Tabriz",
    "Mashhad", "Reno", "Boise", "Tucson", "Albuquerque", "El Paso", "San Antonio", "Oklahoma City",
    "Tulsa", "Omaha", "Wichita", "Kansas City", "St. Louis", "Memphis", "Nashville", "Louisville",
    "Indianapolis", "Columbus", "Cleveland", "Detroit", "Milwaukee", "Minneapolis", "Des Moines",
    "Pittsburgh", "Philadelphia", "Baltimore", "Richmond", "Raleigh", "Charlotte", "Savannah",
    "Tampa", "Orlando", "Jacksonville", "New Orleans", "Baton Rouge", "Little Rock", "Birmingham",
    "Salt Lake City", "Las Vegas", "Sacramento", "Portland", "Spokane", "Fairbanks", "Juneau",
    "Winnipeg", "Calgary", "Edmonton", "Regina", "Saskatoon", "Halifax", "Quebec City", "Victoria",
    "Whitehorse", "Yellowknife", "Iqaluit", "Nuuk", "Tijuana", "Monterrey", "Guadalajara",
    "Puebla", "Oaxaca", "Merida", "Cancun", "Guatemala City", "San Salvador", "Tegucigalpa",
    "Managua", "San Jose", "Panama City", "Kingston", "Nassau", "Santo Domingo", "Port-au-Prince",
    "San Juan", "Bridgetown", "Port of Spain", "Georgetown", "Paramaribo", "Cayenne", "Medellin",
    "Cali", "Cartagena", "Barranquilla", "Maracaibo", "Guayaquil", "Cuenca", "Cusco", "Arequipa",
    "Sucre", "Cochabamba", "Santa Cruz", "Asuncion", "Cordoba", "Rosario", "Mendoza", "Salta",
    "Ushuaia", "Valparaiso", "Concepcion", "Punta Arenas", "Porto Alegre", "Curitiba",
    "Florianopolis", "Belo Horizonte", "Brasilia", "Salvador", "Recife", "Fortaleza", "Manaus",
    "Belem", "Galway", "Cork", "Limerick", "Belfast", "Aberdeen", "Inverness", "Dundee", "York",
    "Leeds", "Manchester", "Liverpool", "Bristol", "Oxford", "Cambridge", "Brighton", "Plymouth",
    "Bordeaux", "Toulouse", "Nantes", "Strasbourg", "Lille", "Rennes", "Grenoble", "Montpellier",
    "Bilbao", "Zaragoza", "Malaga", "Granada", "Palma", "Coimbra", "Faro", "Braga", "Genoa",
    "Turin", "Bologna", "Verona", "Palermo", "Catania", "Bari", "Cagliari", "Trieste", "Utrecht",
    "Rotterdam", "Eindhoven", "Groningen", "Antwerp", "Ghent", "Bruges", "Liege", "Luxembourg",
    "Cologne", "Frankfurt", "Stuttgart", "Dresden", "Leipzig", "Nuremberg", "Bremen", "Hanover",
    "Dusseldorf", "Heidelberg", "Freiburg", "Basel", "Bern", "Lausanne", "Lugano", "Vaduz",
    "Monaco", "Andorra la Vella", "San Marino", "Akureyri", "Torshavn",
]

# Sound pieces of many languages, for made-up names (the city argument must be copied from the
# prompt, so the names it sees in training have to be too varied to be guessed).
_ONSETS = ["", "", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v",
           "w", "z", "br", "bl", "ch", "cr", "dr", "fr", "gr", "gl", "kr", "kl", "pl", "pr", "sh",
           "sk", "sl", "sm", "sn", "sp", "st", "str", "sv", "th", "tr", "ts", "tz", "kh", "gh", "zh",
           "dj", "dzh", "hv", "kj", "lj", "nj", "ng", "mb", "nd", "ny", "ps", "q", "qu", "x", "y",
           "cz", "sz", "rz", "wr", "bh", "dh", "ph", "gn", "hl", "tl", "ll", "rh", "sch", "wh"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "u", "y", "ae", "ai", "au", "ei", "ia", "ie",
           "io", "oa", "oe", "oi", "oo", "ou", "ua", "ue", "ui", "ee", "aa", "uu", "eo"]
_CODAS = ["", "", "", "", "n", "m", "r", "l", "s", "k", "t", "d", "g", "x", "z", "ng", "nk", "rk",
          "rt", "rd", "st", "sk", "ld", "lt", "ck", "sh", "th", "ch", "ff", "ss", "tt", "nn", "ll",
          "rg", "rn", "nd", "mp", "ps", "ts", "v", "b", "p", "h", "j"]
_ENDINGS = ["", "", "", "", "", "burg", "berg", "ville", "ton", "polis", "grad", "stad", "vik",
            "holm", "by", "ford", "ham", "chester", "abad", "pur", "pura", "garh", "kent", "shahr",
            "dorf", "heim", "hausen", "ovo", "evo", "ice", "ova", "sk", "insk", "ovka", "ino", "ia",
            "ona", "ana", "ano", "ella", "ada", "opolis", "mouth", "field", "wick", "bury", "port",
            "haven", "dale", "mere", "iz", "oz", "an", "ul", "ek", "yn", "wa", "ka", "shi", "ma",
            "gawa", "saki", "oto", "enge", "ango", "ara", "oko", "ungu"]
_PREFIXES = ["San", "Santa", "Santo", "Sao", "New", "Port", "Saint", "St.", "El", "La", "Las", "Los",
             "Le", "Al", "Fort", "Lake", "Mount", "Cape", "North", "South", "East", "West", "Upper",
             "Lower", "Bad", "Puerto", "Nueva", "Novo", "Nova", "Ciudad", "Villa", "Bandar", "Kota",
             "Ban", "Ras", "Sidi", "Ain", "Old", "Great", "Little", "Nizhny", "Velikiy", "Stary"]
_SUFFIXES = ["City", "Town", "Beach", "Falls", "Springs", "Bay", "Harbor", "Heights", "Hills",
             "Junction", "Island", "Park", "Creek", "Valley", "Point", "Village"]
_CONNECT = ["de", "del", "do", "da", "di", "on", "upon", "am", "an der", "sur", "en", "la", "el"]
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _syllable_word(rng) -> str:
    n = rng.choice([1, 2, 2, 2, 3, 3])
    w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS) if rng.random() < 0.4 else "")
                for _ in range(n))
    return (w + rng.choice(_ENDINGS)) if len(w) < 7 else w[:12]


def _random_letters(rng) -> str:
    return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(3, 10)))


def _name_word(rng) -> str:
    r = rng.random()
    if r < 0.25:
        w = rng.choice(TRAIN_CITIES + MORE_REAL_CITIES).split()[0]
    elif r < 0.75:
        w = _syllable_word(rng)
    else:
        w = _random_letters(rng)
    return w[:1].upper() + w[1:]


def _contains_heldout(name: str) -> bool:
    low = name.lower()
    return any(c.lower() in low for c in HELDOUT_CITIES)


def rand_city(rng) -> str:
    """A place name for tool calls and copy tasks: real names (30%), made-up names from the sound
    pieces of many languages, random letter strings, multi-word, hyphenated and apostrophe forms,
    in the user's casing. Never contains a held-out city."""
    while True:
        r = rng.random()
        if r < 0.3:
            name = rng.choice(TRAIN_CITIES + MORE_REAL_CITIES)
        elif r < 0.72:
            name = _name_word(rng)
        elif r < 0.8:
            name = rng.choice(_PREFIXES) + " " + _name_word(rng)
        elif r < 0.85:
            name = _name_word(rng) + " " + rng.choice(_SUFFIXES)
        elif r < 0.9:
            name = _name_word(rng) + rng.choice([" ", "-"]) + rng.choice(_CONNECT) + \
                rng.choice([" ", "-"]) + _name_word(rng)
        elif r < 0.96:
            name = _name_word(rng) + "-" + _name_word(rng)
        else:
            name = _name_word(rng) + "'" + _name_word(rng).lower()
        c = rng.random()
        if c < 0.08:
            name = name.lower()
        elif c < 0.11:
            name = name.upper()
        if not _contains_heldout(name):
            return name


WORDS = [
    "the", "cat", "dog", "sun", "moon", "tree", "house", "river", "apple", "banana", "orange",
    "green", "blue", "red", "yellow", "black", "white", "happy", "quick", "slow", "big", "small",
    "bird", "fish", "water", "fire", "stone", "paper", "book", "pen", "table", "chair", "door",
    "window", "road", "car", "train", "boat", "city", "town", "garden", "flower", "rain", "snow",
    "wind", "cloud", "star", "light", "dark", "night", "day", "morning", "evening", "music",
    "song", "dance", "game", "ball", "friend", "family", "mother", "father", "child", "teacher",
    "school", "market", "bread", "milk", "cheese", "coffee", "tea", "sugar", "salt", "honey",
    "forest", "mountain", "ocean", "island", "bridge", "tower", "castle", "king", "queen",
    "horse", "mouse", "lion", "tiger", "bear", "wolf", "fox", "rabbit", "owl", "frog", "snake",
    "runs", "jumps", "sleeps", "eats", "sings", "reads", "writes", "walks", "swims", "flies",
    "and", "or", "but", "with", "under", "over", "near", "far", "very", "always", "never",
    "red", "silver", "golden", "warm", "cold", "old", "new", "bright", "quiet", "loud", "soft",
]

CONDITIONS = ["sunny", "cloudy", "rainy", "snowy", "windy", "foggy", "partly cloudy", "stormy",
              "clear"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "NOK", "SEK", "CAD", "AUD", "INR"]

TOOL_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOOL_TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOOL_CURRENCY = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount of money",
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
        "required": ["amount", "from", "to"]}}}
ALL_TOOLS = [TOOL_WEATHER, TOOL_TIME, TOOL_CURRENCY]

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are lily-tiny, a small helpful assistant.",
                  "You are a concise assistant."]

IDENTITY = ("I am lily-tiny, a very small model trained for the lily inference engine. I can add "
            "and subtract numbers up to 999, repeat, reverse, uppercase or count words, and call "
            "tools such as get_weather.")

# --------------------------------------------------------------------------------------------
# Generators: each returns one example dict {messages, tools, enable_thinking, kind, ...}
# --------------------------------------------------------------------------------------------

ADD_Q = ["What is {a} + {b}?", "What is {a} plus {b}?", "Calculate {a} + {b}.", "{a} + {b} = ?",
         "Add {a} and {b}.", "What's the sum of {a} and {b}?", "How much is {a}+{b}?",
         "Compute {a}+{b}", "{a}+{b}", "Please add {a} to {b}."]
SUB_Q = ["What is {a} - {b}?", "What is {a} minus {b}?", "Calculate {a} - {b}.", "{a} - {b} = ?",
         "Subtract {b} from {a}.", "What's {a} minus {b}?", "How much is {a}-{b}?",
         "Compute {a}-{b}", "{a}-{b}", "Take {b} away from {a}."]


def add_work(a: int, b: int) -> str:
    """Column addition by peeling off the last digits. Every step has the same shape,
    "A+B carry c: x+y+c=s, digits R." where x and y are the last digits of the numbers A and B
    written just before (0 once a number is used up), c the carry in, and R the result digits so
    far. The digit look-up and the digit fact are local and the same in every column: a column's
    step looks like the first step of a shorter problem (so the ones column, whose digit pairs
    the held-out rule constrains, shares everything with the other columns)."""
    A, B, c, digits, steps = str(a), str(b), 0, "", []
    while A or B:
        x, y = (int(A[-1]) if A else 0), (int(B[-1]) if B else 0)
        s = x + y + c
        digits = str(s % 10) + digits
        steps.append("%s+%s carry %d: %d+%d+%d=%d, digits %s." % (A or "0", B or "0", c, x, y, c, s, digits))
        c, A, B = s // 10, A[:-1], B[:-1]
    steps.append("Final carry %d: %s." % (c, ("1" if c else "") + digits))
    return " ".join(steps)


def sub_work(top: int, bot: int) -> str:
    """top >= bot. Same peeling as add_work: "T-B borrow k: x-y-k=v, digits R." and, when v is
    negative, "x-y-k=v+10=d" (the next step then borrows 1)."""
    T, B, br, digits, steps = str(top), str(bot), 0, "", []
    while T:
        x, y = int(T[-1]), (int(B[-1]) if B else 0)
        v = x - y - br
        if v < 0:
            calc, d, nbr = "%d-%d-%d=%d+10=%d" % (x, y, br, v, v + 10), v + 10, 1
        else:
            calc, d, nbr = "%d-%d-%d=%d" % (x, y, br, v), v, 0
        digits = str(d) + digits
        steps.append("%s-%s borrow %d: %s, digits %s." % (T, B or "0", br, calc, digits))
        br, T, B = nbr, T[:-1], B[:-1]
    steps.append("Result: %s." % (digits.lstrip("0") or "0"))
    return " ".join(steps)


def arith_work(a: int, op: str, b: int) -> str:
    """The worked solution (used as the reasoning with thinking on, and inside the answer with
    thinking off)."""
    if op == "+":
        return "%s So %d + %d = %d." % (add_work(a, b), a, b, a + b)
    if a >= b:
        return "%s So %d - %d = %d." % (sub_work(a, b), a, b, a - b)
    return ("%d is larger than %d, so I compute %d - %d and negate it. %s So %d - %d = %d."
            % (b, a, b, a, sub_work(b, a), a, b, a - b))


def arith_reasoning(a: int, op: str, b: int) -> str:
    return "The user asks for %d %s %d. %s" % (a, op, b, arith_work(a, op, b))


def arith_answer(rng: random.Random, a: int, op: str, b: int, think: bool = True) -> str:
    c = a + b if op == "+" else a - b
    if not think:
        # No reasoning block: the model shows the same column work in the answer (a 20M model
        # cannot add 3-digit numbers in one step); the last integer is the result.
        return "Working it out: %s" % arith_work(a, op, b)
    r = rng.random()
    if r < 0.75:
        return "%d %s %d = %d." % (a, op, b, c)
    if r < 0.9:
        return "The answer is %d." % c
    return "%d" % c


def arith_question(rng: random.Random, a: int, op: str, b: int) -> str:
    return rng.choice(ADD_Q if op == "+" else SUB_Q).format(a=a, b=b)


def rand_operand(rng: random.Random) -> int:
    if rng.random() < 0.55:
        return rng.randrange(1000)
    return rng.randrange(10 ** rng.randint(1, 3))


def rand_pair(rng: random.Random, heldout: bool = False) -> tuple[int, int]:
    while True:
        a, b = rand_operand(rng), rand_operand(rng)
        if is_heldout_pair(a, b) == heldout:
            return a, b


def assistant(content: str, reasoning: str, think: bool, tool_calls=None) -> dict:
    m = {"role": "assistant", "content": content, "reasoning_content": reasoning if think else ""}
    if tool_calls:
        m["tool_calls"] = tool_calls
    return m


def gen_arith(rng, think, heldout=False):
    a, b = rand_pair(rng, heldout)
    op = rng.choice("+-")
    msgs = [{"role": "user", "content": arith_question(rng, a, op, b)},
            assistant(arith_answer(rng, a, op, b, think), arith_reasoning(a, op, b), think)]
    return {"kind": "arith", "messages": msgs, "answer": a + b if op == "+" else a - b}


def rand_phrase(rng, lo=2, hi=6):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def gen_instr(rng, think):
    words = rand_phrase(rng).split()
    phrase = " ".join(words)
    task = rng.choice(["repeat", "reverse", "upper", "count"])
    if task == "repeat":
        q = rng.choice(["Repeat after me: {p}", "Say exactly: {p}", "Please repeat: {p}",
                        "Repeat this text: {p}", "Echo: {p}"]).format(p=phrase)
        reasoning, answer = "The user wants the text repeated exactly: %s." % phrase, phrase
    elif task == "reverse":
        q = rng.choice(["Reverse the order of these words: {p}", "Reverse the words: {p}",
                        "Write these words backwards: {p}", "Say in reverse order: {p}"]
                       ).format(p=phrase)
        rev = " ".join(reversed(words))
        reasoning = "The words are: %s. In reverse order: %s." % (", ".join(words),
                                                                  ", ".join(reversed(words)))
        answer = rev
    elif task == "upper":
        q = rng.choice(["Convert to uppercase: {p}", "Write this in capital letters: {p}",
                        "Uppercase: {p}", "Make this uppercase: {p}"]).format(p=phrase)
        reasoning = "Each word in capital letters: %s." % ", ".join(w.upper() for w in words)
        answer = phrase.upper()
    else:
        q = rng.choice(["How many words are in this sentence: {p}", "Count the words: {p}",
                        "How many words: {p}", "Count the words in \"{p}\""]).format(p=phrase)
        reasoning = "Counting: %s. That is %d words." % (
            ", ".join("%d %s" % (i + 1, w) for i, w in enumerate(words)), len(words))
        answer = rng.choice(["There are %d words.", "%d"]) % len(words)
    msgs = [{"role": "user", "content": q}, assistant(answer, reasoning, think)]
    return {"kind": "instr_" + task, "messages": msgs, "answer": answer}


CHAT = [
    (["Hi", "Hello", "Hello!", "Hi there", "Hey", "Good morning", "Good evening"],
     "The user greets me.", ["Hello! How can I help you today?", "Hi! What can I do for you?"]),
    (["Who are you?", "What are you?", "What is your name?", "Tell me about yourself.",
      "Introduce yourself."], "The user asks who I am.", [IDENTITY]),
    (["What can you do?", "Help", "How can you help me?", "What are your skills?"],
     "The user asks what I can do.", [IDENTITY]),
    (["Thanks!", "Thank you", "Thank you very much.", "Great, thanks."],
     "The user thanks me.", ["You're welcome!", "Glad I could help."]),
    (["What is the capital of France?", "Write a poem about the sea.", "Explain quantum physics.",
      "Who won the world cup?", "Tell me a story.", "What is the meaning of life?",
      "Translate hello into German.", "Write some Python code."],
     "This is outside what I was trained for.",
     ["I am lily-tiny, a very small test model, so I cannot answer that. I can do arithmetic, "
      "simple word tasks and tool calls."]),
]


def gen_chat(rng, think):
    qs, reasoning, answers = rng.choice(CHAT)
    msgs = [{"role": "user", "content": rng.choice(qs)}, assistant(rng.choice(answers), reasoning,
                                                                   think)]
    return {"kind": "chat", "messages": msgs}


def weather_for(rng, city):
    return {"city": city, "temperature": rng.randint(-15, 38), "condition": rng.choice(CONDITIONS)}


WEATHER_Q = ["What's the weather in {c}?", "What is the weather like in {c} today?",
             "How's the weather in {c}?", "Tell me the weather in {c}.", "weather in {c}",
             "Can you check the weather in {c}?", "Is it cold in {c} right now?",
             "What is the temperature in {c}?"]
TIME_Q = ["What time is it in {c}?", "What's the local time in {c}?",
          "Tell me the current time in {c}.", "Can you check the time in {c}?"]
CURR_Q = ["Convert {n} {f} to {t}.", "How much is {n} {f} in {t}?", "What is {n} {f} in {t}?"]


def tool_call(name, args):
    return [{"type": "function", "function": {"name": name, "arguments": args}}]


def tools_with(rng, needed):
    others = [t for t in ALL_TOOLS if t is not needed]
    rng.shuffle(others)
    tools = [needed] + others[: rng.randint(0, 2)] if needed else others[: rng.randint(1, 3)]
    rng.shuffle(tools)
    return tools


def weather_exchange(rng, city, think, q=None):
    """[user, assistant(tool call), tool, assistant(answer)] for a weather question."""
    w = weather_for(rng, city)
    q = q or rng.choice(WEATHER_Q).format(c=city)
    call = assistant("", "The user wants the weather in %s. I will call get_weather with city %s."
                     % (city, city), think, tool_call("get_weather", {"city": city}))
    answer = rng.choice(["The weather in {c} is {w} with a temperature of {t}°C.",
                         "It is {w} in {c} and {t}°C.",
                         "Right now {c} is {w}, {t}°C."]).format(c=city, w=w["condition"],
                                                                 t=w["temperature"])
    final = assistant(answer, "The tool says %s is %s with %d°C." % (city, w["condition"],
                                                                    w["temperature"]), think)
    return [{"role": "user", "content": q}, call,
            {"role": "tool", "content": json.dumps(w, ensure_ascii=False)}, final], w


def gen_tool(rng, think):
    r = rng.random()
    city = rand_city(rng)
    if r < 0.62:
        tools = tools_with(rng, TOOL_WEATHER)
        msgs, _ = weather_exchange(rng, city, think)
        kind = "tool_weather"
    elif r < 0.82:
        tools = tools_with(rng, TOOL_TIME)
        hh, mm = rng.randrange(24), rng.randrange(60)
        t = "%02d:%02d" % (hh, mm)
        msgs = [{"role": "user", "content": rng.choice(TIME_Q).format(c=city)},
                assistant("", "The user wants the local time in %s. I will call get_time with city "
                          "%s." % (city, city), think, tool_call("get_time", {"city": city})),
                {"role": "tool", "content": json.dumps({"city": city, "time": t})},
                assistant("The local time in %s is %s." % (city, t),
                          "The tool says it is %s in %s." % (t, city), think)]
        kind = "tool_time"
    elif r < 0.9:
        tools = tools_with(rng, TOOL_CURRENCY)
        n = rng.choice([rng.randint(1, 999), rng.randint(1, 99) * 10])
        f, t = rng.sample(CURRENCIES, 2)
        res = round(n * rng.uniform(0.05, 3.0), 2)
        msgs = [{"role": "user", "content": rng.choice(CURR_Q).format(n=n, f=f, t=t)},
                assistant("", "The user wants to convert %d %s to %s. I will call convert_currency."
                          % (n, f, t), think,
                          tool_call("convert_currency", {"amount": n, "from": f, "to": t})),
                {"role": "tool", "content": json.dumps({"amount": n, "from": f, "to": t,
                                                        "result": res})},
                assistant("%d %s is %s %s." % (n, f, res, t),
                          "The tool says %d %s is %s %s." % (n, f, res, t), think)]
        kind = "tool_currency"
    else:
        # Tools are offered but none is needed: answer directly.
        tools = tools_with(rng, None)
        ex = gen_arith(rng, think) if rng.random() < 0.6 else gen_instr(rng, think)
        msgs, kind = ex["messages"], "tool_none"
    if kind != "tool_none" and rng.random() < 0.3:
        msgs = msgs[:2]                      # stop after the call (a shorter example)
    return {"kind": kind, "messages": msgs, "tools": tools,
            "spans": [city] if kind in ("tool_weather", "tool_time") else []}


def gen_copy(rng, think):
    """Repeat an arbitrary text (place names, made-up words, random letters, a few known words):
    the answer can only come from copying the prompt."""
    items = []
    for _ in range(rng.choice([1, 1, 2, 2, 3, 4])):
        items.append(rand_city(rng) if rng.random() < 0.75 else rng.choice(WORDS))
    phrase = " ".join(items)
    q = rng.choice(["Repeat after me: {p}", "Say exactly: {p}", "Please repeat: {p}",
                    "Repeat this text: {p}", "Echo: {p}", "Copy this: {p}",
                    "Write exactly this: {p}"]).format(p=phrase)
    msgs = [{"role": "user", "content": q},
            assistant(phrase, "The user wants the text repeated exactly: %s." % phrase, think)]
    return {"kind": "copy", "messages": msgs, "answer": phrase, "spans": [i for i in items if i not in WORDS]}


def gen_multi(rng, think):
    first = rng.choice([gen_arith, gen_instr, gen_chat, gen_tool])(rng, think)
    second = rng.choice([gen_arith, gen_arith, gen_instr, gen_chat, gen_copy])(rng, think)
    ex = {"kind": "multi", "messages": first["messages"] + second["messages"],
          "spans": first.get("spans", []) + second.get("spans", [])}
    if "tools" in first:
        ex["tools"] = first["tools"]
    return ex


# Weights by example (tool examples are long: the tool preamble is most of their tokens).
MIX = [(gen_arith, 0.45), (gen_instr, 0.14), (gen_copy, 0.07), (gen_tool, 0.24), (gen_chat, 0.03),
       (gen_multi, 0.07)]


def generate_one(rng: random.Random) -> dict:
    think = rng.random() < 0.7
    r, acc = rng.random(), 0.0
    for fn, p in MIX:
        acc += p
        if r < acc:
            break
    ex = fn(rng, think)
    if "tools" not in ex and rng.random() < 0.3:
        ex["messages"] = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] + ex["messages"]
    elif "tools" in ex and rng.random() < 0.2:
        ex["messages"] = [{"role": "system", "content": SYSTEM_PROMPTS[0]}] + ex["messages"]
    ex["enable_thinking"] = think
    return ex


def generate(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [generate_one(rng) for _ in range(n)]


def render_chunk(args) -> list[tuple[list[tuple[str, bool]], str, list[str]]]:
    """Worker entry point: (seed, n) -> for each of n examples (segments, kind, spans), spans being
    the arbitrary strings it copies (place names, made-up words; see tokenizer_text)."""
    seed, n = args
    template = make_template()
    return [(segments(template, ex), ex["kind"], ex.get("spans", [])) for ex in generate(seed, n)]


def tokenizer_text(segs, spans) -> str:
    """An example's text for training the tokenizer, with its copied names removed: BPE then has
    no merges specific to place names, so every name (the held-out ones too) is cut into the same
    short generic pieces as the training names, and copying it is copying common tokens."""
    text = "".join(s for s, _ in segs)
    for sp in sorted(set(spans), key=len, reverse=True):
        text = text.replace(sp, " ")
    return text


# --------------------------------------------------------------------------------------------
# Held-out test set
# --------------------------------------------------------------------------------------------

def expected_tool_text(name: str, args: dict) -> str:
    s = "<tool_call>\n<function=%s>\n" % name
    for k, v in args.items():
        s += "<parameter=%s>\n%s\n</parameter>\n" % (k, v if isinstance(v, str) else json.dumps(v))
    return s + "</function>\n</tool_call>"


def heldout_tests(seed: int = 1234, n_arith: int = 200) -> dict:
    """Ready-made prompts whose answers need generalisation (never seen in training)."""
    rng = random.Random(seed)
    template = make_template()
    tests = []
    seen = set()
    while len([t for t in tests if t["kind"] == "arith"]) < n_arith:
        a, b = rand_pair(rng, heldout=True)
        op = "+-"[len(tests) % 2]
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        think = len(tests) % 4 != 3          # a quarter with thinking off
        tests.append({"kind": "arith", "enable_thinking": think, "tools": None,
                      "messages": [{"role": "user", "content": arith_question(rng, a, op, b)}],
                      "expected_answer": str(a + b if op == "+" else a - b)})
    for i, city in enumerate(HELDOUT_CITIES):
        tools = [TOOL_WEATHER, TOOL_TIME] if i % 2 == 0 else [TOOL_TIME, TOOL_CURRENCY, TOOL_WEATHER]
        q = WEATHER_Q[i % 3].format(c=city)
        tests.append({"kind": "tool_call", "enable_thinking": True, "tools": tools,
                      "messages": [{"role": "user", "content": q}],
                      "expected_tool_call": {"name": "get_weather", "arguments": {"city": city}},
                      "expected_content": expected_tool_text("get_weather", {"city": city})})
        msgs, w = weather_exchange(rng, city, True, q)
        tests.append({"kind": "tool_answer", "enable_thinking": True, "tools": tools,
                      "messages": msgs[:3],
                      "expected_contains": [city, str(w["temperature"]), w["condition"]]})
    for _ in range(24):
        ex = gen_instr(rng, True)
        tests.append({"kind": ex["kind"], "enable_thinking": True, "tools": None,
                      "messages": ex["messages"][:1], "expected_content": ex["answer"]})
    tests.append({"kind": "chat", "enable_thinking": True, "tools": None,
                  "messages": [{"role": "user", "content": "Who are you?"}],
                  "expected_contains": ["lily-tiny"]})
    for t in tests:
        t["prompt"] = generation_prompt(template, t)
    return {
        "description": "Held-out tests for lily-tiny. Each test: messages (+ tools, "
                       "enable_thinking) rendered with the Qwen3.6 template into `prompt` (the full "
                       "generation prompt). Greedy decoding. Content = the completion after "
                       "'</think>' (stripped), up to <|im_end|>. arith: the last integer of the "
                       "content equals expected_answer. tool_call: content equals "
                       "expected_content (one Qwen XML tool call). tool_answer / chat: content "
                       "contains every expected_contains string. instr_*: content equals "
                       "expected_content.",
        "heldout_pair_rule": "(a*7 + b*13) % 10 == 0, for both + and -; such pairs never occur "
                             "in training",
        "heldout_cities": HELDOUT_CITIES,
        "tests": tests,
    }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

_PAIR_RES = [re.compile(r"asks for (\d+) ([+-]) (\d+)\."), re.compile(r"(\d+) ([+-]) (\d+) = "),
              re.compile(r"(\d+) ?([+-]) ?(\d+)"), re.compile(r"(?:Add|add) (\d+) (and|to) (\d+)"),
              re.compile(r"(?:sum of) (\d+) (and) (\d+)"), re.compile(r"(\d+) (plus|minus) (\d+)"),
              re.compile(r"(?:Subtract|Take) (\d+) (from|away from) (\d+)")]


def _check(n: int, seed: int) -> None:
    """Self-check and statistics: segment structure, arithmetic correctness, no held-out pair or
    city anywhere in the training text, task mix and lengths (characters; about 3.3 characters a
    token with the trained tokenizer)."""
    template = make_template()
    kinds: dict[str, list[int]] = {}
    think_n = 0
    heldout_low = [c.lower() for c in HELDOUT_CITIES]
    pairs_seen = 0
    cities = set()
    for ex in generate(seed, n):
        segs = segments(template, ex)
        text = "".join(s for s, _ in segs)
        loss_chars = sum(len(s) for s, l in segs if l)
        k = kinds.setdefault(ex["kind"], [0, 0, 0, 0])
        k[0] += 1
        k[1] += len(text)
        k[2] += loss_chars
        k[3] = max(k[3], len(text))
        think_n += ex["enable_thinking"]
        cities.update(ex.get("spans", []))
        for s, loss in segs:
            if loss:
                assert s.endswith(IM_END) and s.count(IM_END) == 1, s
        low = text.lower()
        for c in heldout_low:
            assert c not in low, (c, text)
        # every arithmetic pair in the text (questions, reasoning, answers) is a training pair
        for rx in _PAIR_RES:
            for m in rx.finditer(text):
                x, y = int(m.group(1)), int(m.group(3))
                if m.group(2) in ("from", "away from"):
                    x, y = y, x
                pairs_seen += 1
                if rx is _PAIR_RES[2]:
                    # "a+b" / "a-b" inside the worked steps are sub-problems (prefixes): only the
                    # question forms are checked with this pattern
                    continue
                assert not is_heldout_pair(x, y), (m.group(0), text)
        for m in ex["messages"]:
            if m["role"] == "user" and ex["kind"] in ("arith", "multi", "tool_none"):
                for rx in _PAIR_RES[2:]:
                    for mm in rx.finditer(m["content"]):
                        x, y = int(mm.group(1)), int(mm.group(3))
                        if mm.group(2) in ("from", "away from"):
                            x, y = y, x
                        assert not is_heldout_pair(x, y), m
        if ex["kind"] == "arith":
            content = ex["messages"][-1]["content"]
            assert re.findall(r"-?\d+", content)[-1] == str(ex["answer"]), ex
            assert re.findall(r"-?\d+", ex["messages"][-1]["reasoning_content"] or "0")[-1] in (
                str(ex["answer"]), "0"), ex
    ho = heldout_tests()
    tot = sum(v[1] for v in kinds.values())
    print("ok: %d examples, thinking on %.0f%%, %d distinct copied names, %d arithmetic pair mentions "
          "checked; %d held-out tests" % (n, 100.0 * think_n / n, len(cities), pairs_seen, len(ho["tests"])))
    print("%-14s %7s %8s %10s %10s %9s" % ("kind", "share", "chars/ex", "loss ch/ex", "max chars", "% chars"))
    for name, (cnt, ch, lc, mx) in sorted(kinds.items()):
        print("%-14s %6.1f%% %8.0f %10.0f %10d %8.1f%%" % (name, 100.0 * cnt / n, ch / cnt, lc / cnt, mx,
                                                           100.0 * ch / tot))
    print("all: %.0f chars/example, %.0f loss chars/example" % (tot / n, sum(v[2] for v in kinds.values()) / n))
    print("sample names:", sorted(cities, key=lambda c: hash(c) % 1000)[:40])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=0, help="print N rendered examples")
    ap.add_argument("--check", type=int, default=0, help="self-check N examples")
    args = ap.parse_args()
    if args.show:
        template = make_template()
        for ex in generate(args.seed, args.show):
            print("=" * 30, ex["kind"], "thinking" if ex["enable_thinking"] else "no-thinking")
            for s, loss in segments(template, ex):
                print(("\x1b[32m%s\x1b[0m" if loss else "%s") % s, end="")
            print()
    if args.check:
        _check(args.check, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
