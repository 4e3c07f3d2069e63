/** What the choice needs to know of a deployment. */
export interface Choosable {
  readonly weight: number;
  readonly fallback: boolean;
}

/**
 * The deployment a call tries next (CONTRACT section 10), or -1 when every one was tried.
 * `tried` is a bit mask of the indexes already tried (or excluded); `coolingUntil[i]` is the
 * epoch ms deployment i's cooldown ends (0: none). In order:
 * 1. a non-fallback deployment not cooling down, chosen by weight;
 * 2. else the first fallback not cooling down, in config order;
 * 3. else (every one left is cooling down) the one whose cooldown ends first.
 */
export function chooseDeployment(
  deployments: readonly Choosable[], tried: number, coolingUntil: ArrayLike<number>, now: number, random: () => number,
): number {
  let total = 0;
  for (let i = 0; i < deployments.length; i++) {
    const d = deployments[i]!;
    if ((tried & (1 << i)) === 0 && !d.fallback && coolingUntil[i]! <= now) total += d.weight;
  }
  if (total > 0) {
    let r = random() * total;
    let last = -1;
    for (let i = 0; i < deployments.length; i++) {
      const d = deployments[i]!;
      if ((tried & (1 << i)) !== 0 || d.fallback || coolingUntil[i]! > now) continue;
      last = i;
      r -= d.weight;
      if (r < 0) return i;
    }
    return last; // r within rounding of total
  }
  let soonest = -1;
  for (let i = 0; i < deployments.length; i++) {
    if ((tried & (1 << i)) !== 0) continue;
    if (coolingUntil[i]! <= now) return i; // a fallback (the non-fallback ones are all cooling or tried)
    if (soonest === -1 || coolingUntil[i]! < coolingUntil[soonest]!) soonest = i;
  }
  return soonest;
}
