/* SPDX-License-Identifier: Apache-2.0 */
/* Uses an installed kiln from C: a call with no tensors is refused with a message, no GPU
 * needed. */
#include <kiln/kiln.h>
#include <stdio.h>

int main(void) {
  kiln_attention_options options;
  kiln_attention_options_init(&options);
  const kiln_status status = kiln_attention(NULL, NULL, NULL, NULL, &options, NULL, NULL);
  const char* message = kiln_last_error();
  printf("kiln_attention with no tensors: status %d: %s\n", (int)status, message);
  return status == KILN_ERROR_INVALID_ARGUMENT && message != NULL && message[0] != '\0' ? 0 : 1;
}
