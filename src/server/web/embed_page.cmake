# embed_page.cmake: writes a C++ source holding a web page's bytes, run at build time
# (src/server/CMakeLists.txt) so that the page ships inside the lily binary with no tool but
# cmake and no build step for the page itself:
#   cmake -DINPUT=chat.html -DOUTPUT=chat_page_data.cpp -P embed_page.cmake
# The output defines, in lily::server (declared in server/chat_page.h):
#   chat_page_html()         the page's bytes
#   chat_page_script_hash()  "sha256-BASE64" of the text of its one <script> element
#   chat_page_style_hash()   the same for its one <style> element
# The hashes go into the page's Content-Security-Policy, which then lets exactly this inline
# script and style run and nothing else (no 'unsafe-inline'): an edit of the page changes them
# here, at build time, so they cannot go stale.
cmake_minimum_required(VERSION 3.25)

if(NOT INPUT OR NOT OUTPUT)
  message(FATAL_ERROR "usage: cmake -DINPUT=page.html -DOUTPUT=out.cpp -P embed_page.cmake")
endif()

# Base64 of a string of hex digits (an even number of them), as CSP hash sources are written.
function(hex_to_base64 hex out_var)
  set(alphabet "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
  string(LENGTH "${hex}" n)
  set(result "")
  set(i 0)
  while(i LESS n)
    math(EXPR left "${n} - ${i}")
    if(left GREATER_EQUAL 6)
      set(take 6)
    else()
      set(take ${left})
    endif()
    string(SUBSTRING "${hex}" ${i} ${take} group)
    # A short last group is padded with zero bits to 3 bytes; its missing bytes become '='.
    while(take LESS 6)
      string(APPEND group "00")
      math(EXPR take "${take} + 2")
    endwhile()
    math(EXPR value "0x${group}")
    if(left GREATER_EQUAL 6)
      set(chars 4)
    else()
      math(EXPR chars "${left} / 2 + 1")  # 1 byte: 2 characters and "=="; 2 bytes: 3 and "="
    endif()
    foreach(shift 18 12 6 0)
      math(EXPR index "(${value} >> ${shift}) & 63")
      if(chars GREATER 0)
        string(SUBSTRING "${alphabet}" ${index} 1 c)
        string(APPEND result "${c}")
      else()
        string(APPEND result "=")
      endif()
      math(EXPR chars "${chars} - 1")
    endforeach()
    math(EXPR i "${i} + 6")
  endwhile()
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

# "sha256-..." of the text between <TAG> and </TAG>; the page must have exactly one such element,
# opened without attributes, so that the text hashed is the text the browser hashes.
function(element_hash page tag out_var)
  string(FIND "${page}" "<${tag}>" open)
  string(FIND "${page}" "<${tag}>" open_last REVERSE)
  string(FIND "${page}" "</${tag}>" close)
  if(open EQUAL -1 OR close EQUAL -1 OR NOT open EQUAL open_last OR close LESS open)
    message(FATAL_ERROR "${INPUT}: expected exactly one <${tag}> ... </${tag}> element")
  endif()
  string(LENGTH "<${tag}>" open_length)
  math(EXPR start "${open} + ${open_length}")
  math(EXPR length "${close} - ${start}")
  string(SUBSTRING "${page}" ${start} ${length} text)
  string(SHA256 digest "${text}")
  hex_to_base64("${digest}" encoded)
  set(${out_var} "sha256-${encoded}" PARENT_SCOPE)
endfunction()

file(READ "${INPUT}" page)
file(READ "${INPUT}" page_hex HEX)
element_hash("${page}" script script_hash)
element_hash("${page}" style style_hash)

string(LENGTH "${page_hex}" hex_length)
if(hex_length EQUAL 0)
  message(FATAL_ERROR "${INPUT} is empty")
endif()
# Bytes as 0xNN, 24 to a line.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${page_hex}")
string(REGEX REPLACE "((0x..,){24})" "\\1\n    " bytes "${bytes}")

get_filename_component(input_name "${INPUT}" NAME)
file(WRITE "${OUTPUT}.tmp"
"// Generated at build time by src/server/web/embed_page.cmake from ${input_name}; do not edit.
#include <string_view>

#include \"server/chat_page.h\"

namespace lily::server {

namespace {
const unsigned char kPage[] = {
    ${bytes}
};
}  // namespace

std::string_view chat_page_html() { return {reinterpret_cast<const char*>(kPage), sizeof kPage}; }
std::string_view chat_page_script_hash() { return \"${script_hash}\"; }
std::string_view chat_page_style_hash() { return \"${style_hash}\"; }

}  // namespace lily::server
")
# Replaced only when different, so that an unchanged page recompiles nothing.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
