# Copies the shipped golden directory, changes one expected token of the top-p row of the sample
# grid (as a changed top-p boundary would), and requires `tinygpt golden verify` on the copy to
# fail with a readable first-mismatch line. The shipped goldens stay untouched.
file(REMOVE_RECURSE ${WORK_DIR})
file(COPY ${GOLDEN_DIR}/ DESTINATION ${WORK_DIR})
execute_process(COMMAND /usr/bin/python3 -c "
import json, sys
p = sys.argv[1] + '/sample_grid.json'
d = json.load(open(p))
row = next(r for r in d['rows'] if r['name'] == 'top-p 0.9')
i = row['prompt_len'] + 10
row['ids'][i] = (row['ids'][i] + 1) % 4096
json.dump(d, open(p, 'w'))
" ${WORK_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not edit the golden copy")
endif()
# Only the case it changed: the uncached 600-token case would add most of a minute and test nothing here.
execute_process(COMMAND ${TINYGPT} golden verify --dir ${WORK_DIR} --case sample-grid RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "golden verify exited ${rc} on a changed golden, expected 1\n${out}\n${err}")
endif()
if(NOT out MATCHES "FAIL sample-grid/top-p 0.9: first mismatch at position [0-9]+: expected")
  message(FATAL_ERROR "no readable mismatch line:\n${out}")
endif()
message(STATUS "${out}")
