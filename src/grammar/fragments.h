// fragments.h: the lexical pieces grammars are made of (JSON text, free text, whitespace).
//
// Every function adds fresh NFA states to the builder and returns their fragment, so a piece
// can be used as often as needed (a bounded repetition is that many calls).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace lily::grammar {

// The bounds that let every JSON text end in a bounded number of bytes (issue 40: a model that
// loops on a digit, a string character or whitespace still reaches the end). llama.cpp's schema
// grammars bound numbers the same way; an unbounded string of a schema (and every string of
// json_object) is one of at most kMaxFreeStringChars characters.
inline constexpr int kMaxIntegerDigits = 16;   // an integer part (or integer) of 1..16 digits
inline constexpr int kMaxFractionDigits = 16;  // after the '.'
inline constexpr int kMaxExponentDigits = 3;   // after the 'e' and its sign
inline constexpr int kMaxFreeStringChars = 1024;
inline constexpr int kMaxFreeKeyChars = 256;  // keys of additional properties
inline constexpr int kMaxNewlines = 2;        // a gap of whitespace: up to 2 newlines, then the indent

// JSON whitespace between tokens, as compact as a model writes it: nothing, one space, or one or
// two newlines then up to max_indent spaces or tabs. max_indent < 0: no whitespace at all.
Fragment json_whitespace(GrammarBuilder& b, int max_indent);

// One character inside a JSON string, as JSON writes it: a UTF-8 encoded code point other than
// '"', '\' and the controls below U+0020, or an escape: \" \\ \/ \b \f \n \r \t, \uXXXX (any hex
// case) of a code point outside the surrogates, or a surrogate pair \uD8xx-\uDBxx \uDCxx-\uDFxx.
// Each is one character for minLength / maxLength, as JSON Schema counts code points.
// raw_lt false: '<' only as an escape (\u003c), so that no markup can appear in the text.
Fragment json_string_char(GrammarBuilder& b, bool raw_lt = true);

// A JSON string with min..max characters (0 <= min <= max), quotes included.
Fragment json_string(GrammarBuilder& b, int min, int max, bool raw_lt = true);

// The rest of a JSON string after its opening quote: 0..max characters and the closing quote.
Fragment json_string_rest(GrammarBuilder& b, int max, bool raw_lt = true);

// A JSON string used as an object key that is none of `excluded` (their exact texts, quotes
// included, as JSON::dump writes them), has no escape and at most kMaxFreeKeyChars characters:
// the keys of additional properties.
Fragment json_key_except(GrammarBuilder& b, const std::vector<std::string>& excluded, bool raw_lt = true);

// -?(0|[1-9][0-9]{0,15}), then for a number (integer_only false) (\.[0-9]{1,16})?
// ([eE][+-]?[0-9]{1,3})? (the bounds above).
Fragment json_number(GrammarBuilder& b, bool integer_only);

// Any bytes in which none of `patterns` occurs (the empty text too).
Fragment text_avoiding(GrammarBuilder& b, const std::vector<std::string>& patterns);

// Any bytes up to and including the first occurrence of `pattern` (the fragment ends there).
Fragment text_until(GrammarBuilder& b, std::string_view pattern);

// One UTF-8 encoded code point except the bytes in `excluded_ascii` (all of them ASCII).
Fragment utf8_char(GrammarBuilder& b, const ByteSet& excluded_ascii);

}  // namespace lily::grammar
