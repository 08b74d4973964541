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

// JSON whitespace between tokens: [ \t\n\r]{0,max}.
Fragment json_whitespace(GrammarBuilder& b, int max);

// One character inside a JSON string, as JSON writes it: a UTF-8 encoded code point other than
// '"', '\' and the controls below U+0020, or an escape: \" \\ \/ \b \f \n \r \t, \uXXXX (any hex
// case) of a code point outside the surrogates, or a surrogate pair \uD8xx-\uDBxx \uDCxx-\uDFxx.
// Each is one character for minLength / maxLength, as JSON Schema counts code points.
// raw_lt false: '<' only as an escape (\u003c), so that no markup can appear in the text.
Fragment json_string_char(GrammarBuilder& b, bool raw_lt = true);

// A JSON string with min..max characters (max < 0: no bound), quotes included.
Fragment json_string(GrammarBuilder& b, int min, int max, bool raw_lt = true);

// A JSON string used as an object key that is none of `excluded` (their exact texts, quotes
// included, as JSON::dump writes them) and has no escape: the keys of additional properties.
Fragment json_key_except(GrammarBuilder& b, const std::vector<std::string>& excluded, bool raw_lt = true);

// -?(0|[1-9][0-9]*), then for a number (integer_only false) (\.[0-9]+)?([eE][+-]?[0-9]+)?.
Fragment json_number(GrammarBuilder& b, bool integer_only);

// Any bytes in which none of `patterns` occurs (the empty text too).
Fragment text_avoiding(GrammarBuilder& b, const std::vector<std::string>& patterns);

// Any bytes up to and including the first occurrence of `pattern` (the fragment ends there).
Fragment text_until(GrammarBuilder& b, std::string_view pattern);

// One UTF-8 encoded code point except the bytes in `excluded_ascii` (all of them ASCII).
Fragment utf8_char(GrammarBuilder& b, const ByteSet& excluded_ascii);

}  // namespace lily::grammar
